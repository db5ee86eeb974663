//! The guest clusters of the embedded backend: their objects (Services, and the ConfigMaps and
//! Events the reconciler reads and writes) kept in the embedded store, and [`ClusterStore`], the store
//! port that shows one guest cluster as if it were that cluster's own API server.
//!
//! A guest object is stored under an internal kind of our own group ([`GROUP`], so it can never be
//! mistaken for a real Service), in the Harvester namespace of its cluster, named
//! `<cluster>.<namespace>.<name>`, with its cluster, namespace and name in a `guestCluster` field.
//! Cluster and namespace are RFC 1123 labels (no dots), so the name is unambiguous and two guest
//! clusters can never collide. Everything else (uid, resourceVersion, finalizers, deletion, the
//! status subresource) is the embedded store's own Kubernetes semantics, unchanged.
//!
//! [`run`] runs one reconciler ([`super::reconcile::run`]) per guest cluster: for every cluster that
//! has a Service here, or a LoadBalancer its reconciler made (so that one left behind is still
//! garbage-collected after a restart).

use std::{collections::HashMap, sync::Arc};

use futures::{StreamExt, stream};
use k8s_openapi::{
    NamespaceResourceScope,
    api::core::v1::{ConfigMap, Event, Service},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span};

use super::{
    decide::{in_scope, maker_of},
    mapping::GuestContext,
    reconcile,
};
use crate::{
    crd::{LoadBalancer, keys, lb_api, lb_kind},
    store::{
        Kind, LabelSelector, NameRule, ObjectStore, Preconditions, StoreError,
        cluster_view::{ClusterScope, ClusterView, Owner},
        watcher::watcher,
    },
};

/// One guest cluster of the embedded store as a store port of its own, as if it were that
/// cluster's API server (the store's [`ClusterView`], scoped by [`ClusterKey`]).
pub type ClusterStore = ClusterView<ClusterKey>;

/// The group of the internal kinds that hold guest objects.
pub const GROUP: &str = "guest.harvester-cloud.io";
const VERSION: &str = "v1";
/// The field of a stored guest object that says whose it is.
const OWNER_FIELD: &str = "guestCluster";

/// The internal kind under which the embedded store keeps guest objects of `kind`.
pub fn internal_kind(kind: &Kind) -> Kind {
    Kind {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}").into(),
        kind: kind.kind.clone(),
        plural: kind.plural.clone(),
        namespaced: true,
        status_subresource: kind.status_subresource,
        names: NameRule::Subdomain,
    }
}

/// The guest kinds kept here (what the reconciler and the HTTP API use).
fn guest_kinds() -> [Kind; 3] {
    [
        Kind::of::<Service>(),
        Kind::of::<ConfigMap>(),
        Kind::of::<Event>(),
    ]
}

/// A guest cluster: the Harvester namespace of its cloud-config and its name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterKey {
    pub namespace: String,
    pub cluster: String,
}

impl ClusterScope for ClusterKey {
    fn cluster(&self) -> &str {
        &self.cluster
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn internal_kind(&self, kind: &Kind) -> Kind {
        internal_kind(kind)
    }

    fn owner_field(&self) -> &'static str {
        OWNER_FIELD
    }
}

/// Why a guest cluster or object name is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClusterNameError {
    #[error("invalid namespace {value:?}: {reason}")]
    Namespace { value: String, reason: String },
    #[error("invalid guest cluster name {value:?}: {reason}")]
    Cluster { value: String, reason: String },
}

impl ClusterKey {
    /// Both names must be RFC 1123 labels.
    pub fn new(namespace: &str, cluster: &str) -> Result<Self, ClusterNameError> {
        crate::validation::dns1123_label(namespace).map_err(|reason| {
            ClusterNameError::Namespace {
                value: namespace.into(),
                reason,
            }
        })?;
        crate::validation::dns1123_label(cluster).map_err(|reason| ClusterNameError::Cluster {
            value: cluster.into(),
            reason,
        })?;
        Ok(ClusterKey {
            namespace: namespace.into(),
            cluster: cluster.into(),
        })
    }

    /// The identity recorded on this cluster's LoadBalancers. The key names one guest cluster of
    /// the embedded store alone (two cannot share both names), so it is the identity; it can never
    /// be a ccm's (a UID).
    pub fn identity(&self) -> String {
        format!("embedded:{}/{}", self.namespace, self.cluster)
    }

    /// The reconciler's view of this cluster. The embedded backend has no `--management-network`.
    pub fn context(&self) -> GuestContext {
        GuestContext {
            cluster: self.cluster.clone(),
            identity: self.identity(),
            lb_namespace: self.namespace.clone(),
            management_network: None,
        }
    }
}

impl std::fmt::Display for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.cluster)
    }
}

/// What deleting a guest cluster removed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterDeletion {
    pub namespace: String,
    pub cluster: String,
    /// `namespace/name` of each Service deleted.
    pub services: Vec<String>,
    /// Names of the LoadBalancers deleted (in `namespace`); their finalizers release the addresses.
    pub load_balancers: Vec<String>,
}

impl ClusterDeletion {
    pub fn is_empty(&self) -> bool {
        self.services.is_empty() && self.load_balancers.is_empty()
    }
}

/// A failed step of deleting a guest cluster.
#[derive(Debug, thiserror::Error)]
pub enum DeleteClusterError {
    #[error("cannot list the {kind}s of guest cluster {cluster}: {source}")]
    List {
        cluster: String,
        kind: String,
        source: StoreError,
    },
    #[error("cannot delete {kind} {name} of guest cluster {cluster}: {source}")]
    Delete {
        cluster: String,
        kind: String,
        name: String,
        source: StoreError,
    },
}

/// Deletes a whole guest cluster: its objects go at once (finalizers and all: the cluster no longer
/// exists, so nothing in it waits for anything), then its `workloadType: cluster` LoadBalancers,
/// whose own finalizers release their addresses. The objects go first so that a reconcile in
/// flight cannot make a LoadBalancer again after they are deleted (one that it still makes is
/// garbage-collected, since its Service is gone).
pub async fn delete_cluster(
    store: &Arc<dyn ObjectStore>,
    harvester: &Arc<dyn ObjectStore>,
    key: &ClusterKey,
) -> Result<ClusterDeletion, DeleteClusterError> {
    let view = ClusterStore::new(store.clone(), key.clone());
    let mut out = ClusterDeletion {
        namespace: key.namespace.clone(),
        cluster: key.cluster.clone(),
        ..Default::default()
    };
    for kind in guest_kinds() {
        let listed = view
            .list(&kind, None, &LabelSelector::everything())
            .await
            .map_err(|source| DeleteClusterError::List {
                cluster: key.to_string(),
                kind: kind.singular(),
                source,
            })?;
        for mut object in listed.items {
            let (namespace, name) = crate::store::object_key(&object);
            let failed = |source| DeleteClusterError::Delete {
                cluster: key.to_string(),
                kind: kind.singular(),
                name: format!("{namespace}/{name}"),
                source,
            };
            let has_finalizers = object
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|f| !f.is_empty());
            if has_finalizers {
                if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                    meta.remove("finalizers");
                }
                match view.replace(&kind, object).await {
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => return Err(failed(e)),
                }
            }
            match view
                .delete(&kind, &namespace, &name, &Preconditions::default())
                .await
            {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(failed(e)),
            }
            if kind.kind == "Service" {
                out.services.push(format!("{namespace}/{name}"));
            }
        }
    }
    let lbs = lb_api(harvester.clone());
    let listed = lbs
        .list(
            Some(&key.namespace),
            &LabelSelector::from_labels([(keys::LABEL_GUEST_CLUSTER, key.cluster.as_str())]),
        )
        .await
        .map_err(|source| DeleteClusterError::List {
            cluster: key.to_string(),
            kind: "loadbalancer".into(),
            source,
        })?;
    // Those it made, and those that record no maker (made before makers were recorded); never
    // one another maker recorded.
    let context = key.context();
    for lb in listed
        .iter()
        .filter(|lb| lb.spec.workload_type == "cluster")
        .filter(|lb| maker_of(lb).is_none_or(|m| m == context.identity))
    {
        let name = lb.metadata.name.clone().unwrap_or_default();
        // One already going (its Service's deletion got there first) is counted, not deleted again.
        if lb.metadata.deletion_timestamp.is_some() {
            out.load_balancers.push(name);
            continue;
        }
        match lbs
            .delete(&key.namespace, &name, &Preconditions::default())
            .await
        {
            Ok(_) => out.load_balancers.push(name),
            Err(e) if e.is_not_found() => {}
            Err(source) => {
                return Err(DeleteClusterError::Delete {
                    cluster: key.to_string(),
                    kind: "loadbalancer".into(),
                    name,
                    source,
                });
            }
        }
    }
    if !out.is_empty() {
        info!(cluster = %key, services = out.services.len(), load_balancers = out.load_balancers.len(), "deleted guest cluster");
    }
    Ok(out)
}

/// Just enough of a stored guest Service to know its cluster.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct ServiceRecord {
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(rename = "guestCluster", default)]
    owner: Option<Owner>,
}

impl kube::Resource for ServiceRecord {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Service".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        GROUP.into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        VERSION.into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "services".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The guest cluster a LoadBalancer was made for by a reconciler (its three labels, and no maker
/// recorded but that cluster), if any.
fn cluster_of_lb(lb: &LoadBalancer) -> Option<ClusterKey> {
    if lb.spec.workload_type != "cluster" {
        return None;
    }
    let labels = lb.metadata.labels.as_ref()?;
    let cluster = labels.get(keys::LABEL_GUEST_CLUSTER)?;
    let key = ClusterKey::new(lb.metadata.namespace.as_deref()?, cluster).ok()?;
    in_scope(&key.context(), lb).then_some(key)
}

/// What the watches say about a guest cluster.
enum Seen {
    /// One of its Services or LoadBalancers exists: it needs a reconciler.
    Live(ClusterKey),
    /// One of them was deleted: it may have nothing left.
    Gone(ClusterKey),
}

/// The guest cluster a stored Service belongs to.
fn cluster_of_service(r: &ServiceRecord) -> Option<ClusterKey> {
    let owner = r.owner.as_ref()?;
    ClusterKey::new(r.metadata.namespace.as_deref()?, &owner.cluster).ok()
}

/// Whether a guest cluster has neither Services nor LoadBalancers left (a failed read counts as
/// "not empty": its reconciler keeps running).
async fn has_nothing_left(
    store: &Arc<dyn ObjectStore>,
    harvester: &Arc<dyn ObjectStore>,
    key: &ClusterKey,
) -> bool {
    let view = ClusterStore::new(store.clone(), key.clone());
    let services = view
        .list(&Kind::of::<Service>(), None, &LabelSelector::everything())
        .await;
    let lbs = lb_api(harvester.clone())
        .list(
            Some(&key.namespace),
            &LabelSelector::from_labels([(keys::LABEL_GUEST_CLUSTER, key.cluster.as_str())]),
        )
        .await;
    match (services, lbs) {
        (Ok(services), Ok(lbs)) => {
            services.items.is_empty()
                && !lbs.iter().any(|lb| cluster_of_lb(lb).as_ref() == Some(key))
        }
        _ => false,
    }
}

/// A running reconciler of one guest cluster.
struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// Runs a reconciler for every guest cluster of the embedded store until `stop`: from the first
/// Service (or LoadBalancer) of a cluster until it has neither left (its last Service deleted and its
/// LoadBalancers released, or the whole cluster deleted), so a deleted cluster leaves no task behind
/// and nothing of it is written again. `harvester` is the store port of LoadBalancers (the embedded
/// store behind admission).
pub async fn run(
    store: Arc<dyn ObjectStore>,
    harvester: Arc<dyn ObjectStore>,
    settings: reconcile::Settings,
    stop: CancellationToken,
) {
    use kube::runtime::watcher::Event as E;
    let services =
        watcher::<ServiceRecord>(store.clone(), internal_kind(&Kind::of::<Service>()), None)
            .filter_map(|e| {
                let seen = match e {
                    Ok(E::Apply(r) | E::InitApply(r)) => cluster_of_service(&r).map(Seen::Live),
                    Ok(E::Delete(r)) => cluster_of_service(&r).map(Seen::Gone),
                    _ => None,
                };
                std::future::ready(seen)
            });
    let lbs = watcher::<LoadBalancer>(store.clone(), lb_kind(), None).filter_map(|e| {
        let seen = match e {
            Ok(E::Apply(lb) | E::InitApply(lb)) => cluster_of_lb(&lb).map(Seen::Live),
            Ok(E::Delete(lb)) => cluster_of_lb(&lb).map(Seen::Gone),
            _ => None,
        };
        std::future::ready(seen)
    });
    let mut seen =
        std::pin::pin!(stream::select(services, lbs).take_until(stop.clone().cancelled_owned()));
    let mut running: HashMap<ClusterKey, Running> = HashMap::new();
    while let Some(event) = seen.next().await {
        match event {
            Seen::Live(key) => {
                if running.contains_key(&key) {
                    continue;
                }
                info!(cluster = %key, "starting the reconciler of guest cluster");
                let ports = reconcile::Ports {
                    guest: Arc::new(ClusterStore::new(store.clone(), key.clone())),
                    harvester: harvester.clone(),
                };
                let cluster_stop = stop.child_token();
                let task = tokio::spawn(
                    reconcile::run(ports, key.context(), settings.clone(), cluster_stop.clone())
                        .instrument(info_span!("guest_cluster", namespace = %key.namespace, cluster = %key.cluster)),
                );
                running.insert(
                    key,
                    Running {
                        stop: cluster_stop,
                        task,
                    },
                );
                crate::metrics::set_guest_clusters(running.len());
            }
            Seen::Gone(key) => {
                if !running.contains_key(&key) || !has_nothing_left(&store, &harvester, &key).await
                {
                    continue;
                }
                let Some(r) = running.remove(&key) else {
                    continue;
                };
                info!(cluster = %key, "guest cluster has nothing left; stopping its reconciler");
                r.stop.cancel();
                // Finished before a new Service of the same cluster starts another one.
                if r.task.await.is_err() {
                    debug!(cluster = %key, "guest cluster reconciler ended abnormally");
                }
                crate::metrics::set_guest_clusters(running.len());
            }
        }
    }
    crate::metrics::set_guest_clusters(0);
    for (key, r) in running {
        if r.task.await.is_err() {
            debug!(cluster = %key, "guest cluster reconciler ended abnormally");
        }
    }
    debug!("guest cluster reconcilers stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{
        Api,
        embedded::{Durability, EmbeddedStore},
    };

    fn mk_service(ns: &str, name: &str) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name, "labels": {"app": "web"}},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
        }))
        .expect("service")
    }

    #[tokio::test]
    async fn clusters_are_apart_and_look_like_api_servers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn ObjectStore> = EmbeddedStore::open(dir.path(), Durability::Normal)
            .await
            .expect("opens");
        let a = Api::<Service>::new(Arc::new(ClusterStore::new(
            store.clone(),
            ClusterKey::new("default", "a").expect("valid"),
        )));
        let b = Api::<Service>::new(Arc::new(ClusterStore::new(
            store.clone(),
            ClusterKey::new("default", "b").expect("valid"),
        )));
        let created = a.create(&mk_service("web", "svc")).await.expect("creates");
        assert_eq!(created.metadata.namespace.as_deref(), Some("web"));
        assert_eq!(created.metadata.name.as_deref(), Some("svc"));
        assert!(created.metadata.uid.is_some(), "the store assigns a uid");
        // The same namespace and name in another cluster is another object.
        let other = b.create(&mk_service("web", "svc")).await.expect("creates");
        assert_ne!(other.metadata.uid, created.metadata.uid);
        assert!(
            a.create(&mk_service("web", "svc"))
                .await
                .expect_err("taken")
                .to_string()
                .contains("\"svc\" already exists")
        );
        let listed = a
            .list(None, &LabelSelector::from_labels([("app", "web")]))
            .await
            .expect("lists");
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].metadata.uid, created.metadata.uid);
        // Stale writes conflict, as on Kubernetes.
        let mut stale = created.clone();
        a.replace(&created).await.expect("no-op replace");
        let mut changed = created.clone();
        changed
            .metadata
            .annotations
            .get_or_insert_default()
            .insert("x".into(), "1".into());
        a.replace(&changed).await.expect("replaces");
        stale.metadata.annotations = Some([("y".to_string(), "2".to_string())].into());
        assert!(matches!(
            a.replace(&stale).await,
            Err(StoreError::Conflict { name, .. }) if name == "svc"
        ));
        assert!(a.get("web", "nope").await.expect("reads").is_none());
        a.delete("web", "svc", &Preconditions::default())
            .await
            .expect("deletes");
        assert!(a.get("web", "svc").await.expect("reads").is_none());
        assert!(b.get("web", "svc").await.expect("reads").is_some());
    }

    /// A batch (the Event recorder's) through a cluster's view: each object answered under its
    /// own name and in its own cluster, a taken name refused alone, the others stored in order.
    #[tokio::test]
    async fn objects_created_each_stay_in_their_cluster() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn ObjectStore> = EmbeddedStore::open(dir.path(), Durability::Normal)
            .await
            .expect("opens");
        let a: Arc<dyn ObjectStore> = Arc::new(ClusterStore::new(
            store.clone(),
            ClusterKey::new("default", "a").expect("valid"),
        ));
        let b = Api::<Service>::new(Arc::new(ClusterStore::new(
            store.clone(),
            ClusterKey::new("default", "b").expect("valid"),
        )));
        let kind = Kind::of::<Service>();
        let object = |name: &str| {
            crate::store::to_stored(&mk_service("web", name))
                .expect("encodes")
                .1
        };
        Api::<Service>::new(a.clone())
            .create(&mk_service("web", "taken"))
            .await
            .expect("creates");
        let answers = a
            .create_each(&kind, vec![object("one"), object("taken"), object("two")])
            .await;
        let names: Vec<String> = answers
            .iter()
            .map(|r| match r {
                Ok(v) => crate::store::object_key(v).1,
                Err(e) => e.to_string(),
            })
            .collect();
        assert_eq!(
            names,
            ["one", "service \"taken\" already exists", "two"],
            "{answers:?}"
        );
        let rv = |i: usize| {
            answers[i].as_ref().expect("created")["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .expect("a version")
        };
        assert!(rv(0) < rv(2), "stored in order");
        a.sync().await.expect("syncs");
        assert!(
            b.get("web", "one").await.expect("reads").is_none(),
            "cluster b has none"
        );
        let listed = Api::<Service>::new(a)
            .list(Some("web"), &LabelSelector::everything())
            .await
            .expect("lists");
        assert_eq!(listed.len(), 3);
    }

    #[tokio::test]
    async fn watch_shows_only_the_cluster() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn ObjectStore> = EmbeddedStore::open(dir.path(), Durability::Normal)
            .await
            .expect("opens");
        let a_store: Arc<dyn ObjectStore> = Arc::new(ClusterStore::new(
            store.clone(),
            ClusterKey::new("default", "a").expect("valid"),
        ));
        let b = Api::<Service>::new(Arc::new(ClusterStore::new(
            store.clone(),
            ClusterKey::new("default", "b").expect("valid"),
        )));
        let a = Api::<Service>::new(a_store.clone());
        let events = watcher::<Service>(a_store, Kind::of::<Service>(), None);
        tokio::pin!(events);
        // Init, InitDone.
        for _ in 0..2 {
            events.next().await.expect("event").expect("ok");
        }
        b.create(&mk_service("web", "other"))
            .await
            .expect("creates");
        a.create(&mk_service("web", "mine")).await.expect("creates");
        match events.next().await.expect("event").expect("ok") {
            kube::runtime::watcher::Event::Apply(s) => {
                assert_eq!(s.metadata.name.as_deref(), Some("mine"));
                assert_eq!(s.metadata.namespace.as_deref(), Some("web"));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn names() {
        assert!(ClusterKey::new("default", "gc1").is_ok());
        assert!(ClusterKey::new("default", "a.b").is_err());
        assert!(ClusterKey::new("Default", "gc1").is_err());
        assert_eq!(
            ClusterKey::new("ns", "x.y").expect_err("dots").to_string(),
            "invalid guest cluster name \"x.y\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        );
    }
}
