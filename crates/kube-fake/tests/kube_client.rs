//! The fake through a kube-rs 5 client, as the kube backend and the reconcilers will use it: typed
//! CRUD and every patch flavour, watchers (list-watch and streaming lists), CRD registration and
//! custom resources with the status subresource, Service status, Events, Leases, metadata lists,
//! and a service-account kubeconfig that gets exactly its granted permissions.

mod support;

use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Secret, Service, ServiceAccount};
use k8s_openapi::api::events::v1::Event as EventsV1;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use support::{eventually, kube_client, kube_client_for, start};

fn api_status(e: &kube::Error) -> Option<&kube::core::Status> {
    match e {
        kube::Error::Api(s) => Some(s),
        _ => None,
    }
}

fn mk_cm(name: &str, labels: serde_json::Value, v: &str) -> Result<ConfigMap> {
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"v": v}}),
    )?)
}

#[tokio::test]
async fn typed_crud_patches_and_server_side_apply() -> Result<()> {
    let fake = start().await?;
    let cms: Api<ConfigMap> = Api::default_namespaced(kube_client(&fake).await?);
    let created = cms
        .create(&PostParams::default(), &mk_cm("c1", json!({}), "1")?)
        .await?;
    assert!(created.uid().is_some() && created.resource_version().is_some());

    let mut next = created.clone();
    next.data = Some([("v".to_string(), "2".to_string())].into());
    let replaced = cms.replace("c1", &PostParams::default(), &next).await?;
    let stale = cms.replace("c1", &PostParams::default(), &next).await;
    let err = stale.err().context("a stale replace must fail")?;
    assert!(api_status(&err).is_some_and(|s| s.is_conflict()), "{err}");

    let merged = cms
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"m": "x"}})),
        )
        .await?;
    assert_eq!(
        merged
            .data
            .as_ref()
            .and_then(|d| d.get("m"))
            .map(String::as_str),
        Some("x")
    );
    let ops: json_patch::Patch =
        serde_json::from_value(json!([{"op": "replace", "path": "/data/v", "value": "3"}]))?;
    let patched = cms
        .patch("c1", &PatchParams::default(), &Patch::Json::<()>(ops))
        .await?;
    assert_eq!(
        patched
            .data
            .as_ref()
            .and_then(|d| d.get("v"))
            .map(String::as_str),
        Some("3")
    );
    assert_ne!(patched.resource_version(), replaced.resource_version());

    let missing = cms.get("nope").await.err().context("missing object")?;
    assert!(api_status(&missing).is_some_and(|s| s.is_not_found() && s.code == 404));
    assert_eq!(cms.get_opt("nope").await?, None);

    let ssa = PatchParams::apply("harvester-cloud").force();
    let applied = cms
        .patch(
            "applied",
            &ssa,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "applied", "labels": {"a": "1", "b": "2"}}, "data": {"k": "v"}})),
        )
        .await?;
    assert_eq!(applied.labels().len(), 2, "apply creates a missing object");
    let reapplied = cms
        .patch(
            "applied",
            &ssa,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "applied", "labels": {"a": "1"}}, "data": {"k": "v"}})),
        )
        .await?;
    assert_eq!(
        reapplied.labels().keys().collect::<Vec<_>>(),
        vec!["a"],
        "fields dropped from the apply are removed"
    );
    let same = cms
        .patch(
            "applied",
            &ssa,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "applied", "labels": {"a": "1"}}, "data": {"k": "v"}})),
        )
        .await?;
    assert_eq!(
        same.resource_version(),
        reapplied.resource_version(),
        "an identical apply is a no-op"
    );

    let deleted = cms.delete("c1", &DeleteParams::default()).await?;
    assert!(deleted.is_right(), "built-in deletes answer a Status");
    Ok(())
}

#[tokio::test]
async fn watcher_sees_changes_in_order() -> Result<()> {
    let fake = start().await?;
    let client = kube_client(&fake).await?;
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    cms.create(
        &PostParams::default(),
        &mk_cm("pre", json!({"app": "w"}), "0")?,
    )
    .await?;
    for config in [
        watcher::Config::default().labels("app=w"),
        watcher::Config::default().labels("app=w").streaming_lists(),
    ] {
        let mut stream = watcher(cms.clone(), config).boxed();
        let mut initial = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(30), stream.try_next()).await?? {
                Some(watcher::Event::InitApply(o)) => initial.push(o.name_any()),
                Some(watcher::Event::InitDone) => break,
                Some(_) => {}
                None => bail!("watch ended"),
            }
        }
        assert_eq!(initial, vec!["pre"]);
        cms.create(
            &PostParams::default(),
            &mk_cm("w1", json!({"app": "w"}), "1")?,
        )
        .await?;
        cms.patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": "2"}})),
        )
        .await?;
        cms.patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"v": "2"}})),
        )
        .await?;
        cms.create(
            &PostParams::default(),
            &mk_cm("other", json!({"app": "x"}), "1")?,
        )
        .await?;
        cms.delete("w1", &DeleteParams::default()).await?;
        let mut seen = Vec::new();
        while let Some(ev) =
            tokio::time::timeout(Duration::from_secs(30), stream.try_next()).await??
        {
            match ev {
                watcher::Event::Apply(o) => seen.push(format!(
                    "apply {} {}",
                    o.name_any(),
                    o.data.unwrap_or_default()["v"]
                )),
                watcher::Event::Delete(o) => {
                    seen.push(format!("delete {}", o.name_any()));
                    break;
                }
                _ => {}
            }
        }
        assert_eq!(seen, vec!["apply w1 1", "apply w1 2", "delete w1"]);
        cms.delete("other", &DeleteParams::default()).await?;
    }
    Ok(())
}

fn lb_crd() -> Result<CustomResourceDefinition> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "loadbalancers.loadbalancer.harvesterhci.io"},
        "spec": {
            "group": "loadbalancer.harvesterhci.io", "scope": "Namespaced",
            "names": {"kind": "LoadBalancer", "plural": "loadbalancers", "singular": "loadbalancer", "shortNames": ["lb"]},
            "versions": [{"name": "v1beta1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {
                        "ipam": {"type": "string", "default": "pool"}, "ipPool": {"type": "string"}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}}}]
        }
    }))?)
}

#[tokio::test]
async fn crd_registration_then_custom_resources_with_status() -> Result<()> {
    let fake = start().await?;
    let client = kube_client(&fake).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &lb_crd()?).await?;
    let established = await_condition(
        crds.clone(),
        "loadbalancers.loadbalancer.harvesterhci.io",
        conditions::is_crd_established(),
    );
    tokio::time::timeout(Duration::from_secs(30), established).await??;

    let discovery = kube::Discovery::new(client.clone())
        .filter(&["loadbalancer.harvesterhci.io"])
        .run()
        .await?;
    let gvk = GroupVersionKind::gvk("loadbalancer.harvesterhci.io", "v1beta1", "LoadBalancer");
    let (ar, caps) = discovery
        .resolve_gvk(&gvk)
        .context("discovery finds the custom kind")?;
    assert_eq!(ar.plural, "loadbalancers");
    assert!(
        caps.subresources
            .iter()
            .any(|(s, _)| s.plural.ends_with("status") || s.plural == "status")
    );

    let ar = ApiResource::from_gvk_with_plural(&gvk, "loadbalancers");
    let lbs: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let obj = DynamicObject::new("lb1", &ar)
        .data(json!({"spec": {"ipPool": "p1", "junk": 1}, "status": {"address": "ignored"}}));
    let created = lbs.create(&PostParams::default(), &obj).await?;
    assert_eq!(
        created.data["spec"],
        json!({"ipPool": "p1", "ipam": "pool"}),
        "pruned and defaulted"
    );
    assert!(
        created.data.get("status").is_none(),
        "status is ignored on create"
    );
    assert_eq!(created.metadata.generation, Some(1));

    let with_status = lbs
        .patch_status(
            "lb1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"address": "10.0.0.5"}, "spec": {"ipPool": "x"}})),
        )
        .await?;
    assert_eq!(with_status.data["status"]["address"], "10.0.0.5");
    assert_eq!(
        with_status.data["spec"]["ipPool"], "p1",
        "/status ignores everything else"
    );
    assert_eq!(with_status.metadata.generation, Some(1));

    let main = lbs
        .patch(
            "lb1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"address": "no"}})),
        )
        .await?;
    assert_eq!(
        main.data["status"]["address"], "10.0.0.5",
        "the main endpoint ignores status"
    );
    assert_eq!(
        main.resource_version(),
        with_status.resource_version(),
        "which makes it a no-op"
    );

    let applied = lbs
        .patch_status(
            "lb1",
            &PatchParams::apply("lb-controller").force(),
            &Patch::Apply(
                json!({"apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
                "status": {"address": "10.0.0.6"}}),
            ),
        )
        .await?;
    assert_eq!(applied.data["status"]["address"], "10.0.0.6");
    let bumped = lbs
        .patch(
            "lb1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ipPool": "p2"}})),
        )
        .await?;
    assert_eq!(bumped.metadata.generation, Some(2));

    let listed = lbs.list(&ListParams::default()).await?;
    assert_eq!(listed.items.len(), 1);
    assert_eq!(
        listed.items[0].types.as_ref().map(|t| t.kind.as_str()),
        Some("LoadBalancer")
    );

    let deleted = lbs.delete("lb1", &DeleteParams::default()).await?;
    assert!(
        deleted.is_left(),
        "custom resource deletes answer the object"
    );
    crds.delete(
        "loadbalancers.loadbalancer.harvesterhci.io",
        &DeleteParams::default(),
    )
    .await?;
    eventually(|| async {
        Ok(crds
            .get_opt("loadbalancers.loadbalancer.harvesterhci.io")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    let gone = lbs
        .list(&ListParams::default())
        .await
        .err()
        .context("the type is no longer served")?;
    assert!(api_status(&gone).is_some_and(|s| s.code == 404));
    Ok(())
}

#[tokio::test]
async fn service_status_subresource() -> Result<()> {
    let fake = start().await?;
    let svcs: Api<Service> = Api::default_namespaced(kube_client(&fake).await?);
    let svc: Service = serde_json::from_value(json!({"metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}, "status": {"loadBalancer": {"ingress": [{"ip": "1.1.1.1"}]}}}))?;
    let created = svcs.create(&PostParams::default(), &svc).await?;
    let spec = created.spec.clone().unwrap_or_default();
    assert!(spec.cluster_ip.is_some());
    assert!(spec.ports.unwrap_or_default()[0].node_port.is_some());
    assert_eq!(
        created
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.clone()),
        None
    );

    let updated = svcs
        .patch_status(
            "web",
            &PatchParams::apply("ccm").force(),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Service", "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.9"}]}}})),
        )
        .await?;
    let ip = |s: &Service| {
        s.status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .and_then(|i| i[0].ip.clone())
    };
    assert_eq!(ip(&updated).as_deref(), Some("10.0.0.9"));
    let mut replaced = updated.clone();
    replaced.status = None;
    let after = svcs
        .replace("web", &PostParams::default(), &replaced)
        .await?;
    assert_eq!(
        ip(&after).as_deref(),
        Some("10.0.0.9"),
        "a replace of the main resource keeps status"
    );
    Ok(())
}

#[tokio::test]
async fn events_recorder_writes_events_readable_through_core_v1() -> Result<()> {
    let fake = start().await?;
    let client = kube_client(&fake).await?;
    let svcs: Api<Service> = Api::default_namespaced(client.clone());
    let svc: Service = serde_json::from_value(
        json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}),
    )?;
    let svc = svcs.create(&PostParams::default(), &svc).await?;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "lb-controller".into(),
            instance: Some("r1".into()),
        },
    );
    let ev = Event {
        type_: EventType::Normal,
        reason: "Allocated".into(),
        note: Some("allocated 10.0.0.1".into()),
        action: "Allocate".into(),
        secondary: None,
    };
    recorder.publish(&ev, &svc.object_ref(&())).await?;
    recorder.publish(&ev, &svc.object_ref(&())).await?;
    let core: Api<CoreEvent> = Api::default_namespaced(client.clone());
    let listed = core
        .list(&ListParams::default().fields("involvedObject.name=web"))
        .await?;
    assert_eq!(listed.items.len(), 1);
    assert_eq!(
        listed.items[0].message.as_deref(),
        Some("allocated 10.0.0.1")
    );
    assert_eq!(listed.items[0].reason.as_deref(), Some("Allocated"));
    let v1: Api<EventsV1> = Api::default_namespaced(client);
    let listed = v1.list(&ListParams::default()).await?;
    assert_eq!(
        listed.items[0].series.as_ref().map(|s| s.count),
        Some(2),
        "the second publish patched the series"
    );
    Ok(())
}

#[tokio::test]
async fn leases_serialize_competing_writers() -> Result<()> {
    let fake = start().await?;
    let leases: Api<Lease> = Api::namespaced(kube_client(&fake).await?, "kube-system");
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "harvester-cloud"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}))?;
    let base = leases.create(&PostParams::default(), &lease).await?;
    let mut take_b = base.clone();
    take_b.spec.get_or_insert_default().holder_identity = Some("b".into());
    let mut take_c = base.clone();
    take_c.spec.get_or_insert_default().holder_identity = Some("c".into());
    leases
        .replace("harvester-cloud", &PostParams::default(), &take_b)
        .await?;
    let lost = leases
        .replace("harvester-cloud", &PostParams::default(), &take_c)
        .await;
    assert!(
        lost.err()
            .as_ref()
            .and_then(api_status)
            .is_some_and(|s| s.is_conflict())
    );
    let holder = leases
        .get("harvester-cloud")
        .await?
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("b"));
    Ok(())
}

#[tokio::test]
async fn metadata_lists() -> Result<()> {
    let fake = start().await?;
    let cms: Api<ConfigMap> = Api::default_namespaced(kube_client(&fake).await?);
    cms.create(
        &PostParams::default(),
        &mk_cm("m1", json!({"a": "b"}), "1")?,
    )
    .await?;
    let meta = cms
        .list_metadata(&ListParams::default().labels("a=b"))
        .await?;
    assert_eq!(
        meta.items.iter().map(|m| m.name_any()).collect::<Vec<_>>(),
        vec!["m1"]
    );
    Ok(())
}

#[tokio::test]
async fn service_account_kubeconfig_gets_exactly_its_permissions() -> Result<()> {
    let fake = start().await?;
    let admin = kube_client(&fake).await?;
    let sas: Api<ServiceAccount> = Api::default_namespaced(admin.clone());
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "cloud"}}))?,
    )
    .await?;
    let secrets: Api<Secret> = Api::default_namespaced(admin.clone());
    let token_secret: Secret = serde_json::from_value(json!({"metadata": {"name": "cloud-token",
        "annotations": {"kubernetes.io/service-account.name": "cloud"}}, "type": "kubernetes.io/service-account-token"}))?;
    secrets
        .create(&PostParams::default(), &token_secret)
        .await?;
    let token = eventually(|| async {
        let s = secrets.get("cloud-token").await?;
        Ok(s.data.and_then(|d| d.get("token").cloned()))
    })
    .await?;
    let token = String::from_utf8(token.0)?;

    let sa_client = kube_client_for(&fake, &token).await?;
    let sa_secrets: Api<Secret> = Api::default_namespaced(sa_client.clone());
    let denied = sa_secrets
        .list(&ListParams::default())
        .await
        .err()
        .context("no RBAC yet")?;
    assert!(api_status(&denied).is_some_and(|s| s.is_forbidden()));

    let rbs: Api<RoleBinding> = Api::default_namespaced(admin.clone());
    let binding: RoleBinding = serde_json::from_value(
        json!({"metadata": {"name": "cloud-secrets"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "secret-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "cloud", "namespace": "default"}]}),
    )?;
    rbs.create(&PostParams::default(), &binding).await?;
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(admin);
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "secret-reader"},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]}]}))?,
        )
        .await?;
    assert_eq!(
        sa_secrets.list(&ListParams::default()).await?.items.len(),
        1
    );
    let elsewhere: Api<Secret> = Api::namespaced(sa_client.clone(), "kube-system");
    assert!(
        elsewhere
            .list(&ListParams::default())
            .await
            .err()
            .as_ref()
            .and_then(api_status)
            .is_some_and(|s| s.is_forbidden())
    );
    let cms: Api<ConfigMap> = Api::default_namespaced(sa_client);
    assert!(
        cms.list(&ListParams::default())
            .await
            .err()
            .as_ref()
            .and_then(api_status)
            .is_some_and(|s| s.is_forbidden())
    );
    Ok(())
}

#[tokio::test]
async fn kube_runtime_finalizer_helper_round_trip() -> Result<()> {
    let fake = start().await?;
    let cms: Api<ConfigMap> = Api::default_namespaced(kube_client(&fake).await?);
    cms.create(&PostParams::default(), &mk_cm("guarded", json!({}), "1")?)
        .await?;
    let run = |obj: ConfigMap| {
        let cms = cms.clone();
        async move {
            let mut seen = Vec::new();
            finalizer(
                &cms,
                "harvester-cloud/cleanup",
                std::sync::Arc::new(obj),
                |ev| {
                    seen.push(match ev {
                        FinalizerEvent::Apply(_) => "apply",
                        FinalizerEvent::Cleanup(_) => "cleanup",
                    });
                    async {
                        Ok::<_, std::convert::Infallible>(
                            kube::runtime::controller::Action::await_change(),
                        )
                    }
                },
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            anyhow::Ok(seen)
        }
    };
    assert!(
        run(cms.get("guarded").await?).await?.is_empty(),
        "the first pass only adds the finalizer"
    );
    assert_eq!(
        cms.get("guarded").await?.finalizers(),
        ["harvester-cloud/cleanup"]
    );
    assert_eq!(run(cms.get("guarded").await?).await?, ["apply"]);
    let pending = cms.delete("guarded", &DeleteParams::default()).await?;
    assert!(
        pending.is_left(),
        "a finalized object is only marked for deletion"
    );
    assert_eq!(run(cms.get("guarded").await?).await?, ["cleanup"]);
    assert_eq!(
        cms.get_opt("guarded").await?,
        None,
        "removing the last finalizer deleted it"
    );
    Ok(())
}

#[tokio::test]
async fn kube_runtime_controller_reconciles_against_the_fake() -> Result<()> {
    use kube::runtime::controller::{Action, Controller};
    use std::sync::Arc;

    let fake = start().await?;
    let client = kube_client(&fake).await?;
    let cms: Api<ConfigMap> = Api::default_namespaced(client);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    async fn reconcile(
        obj: Arc<ConfigMap>,
        api: Arc<Api<ConfigMap>>,
    ) -> Result<Action, kube::Error> {
        if obj.labels().get("reconciled").is_none() {
            let patch = json!({"metadata": {"labels": {"reconciled": "yes"}}});
            api.patch(
                &obj.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await?;
        }
        Ok(Action::await_change())
    }
    fn error_policy(_: Arc<ConfigMap>, _: &kube::Error, _: Arc<Api<ConfigMap>>) -> Action {
        Action::requeue(Duration::from_millis(100))
    }
    let controller = Controller::new(
        cms.clone(),
        watcher::Config::default().labels("managed=true"),
    )
    .graceful_shutdown_on(async move {
        let _ = stop_rx.await;
    })
    .run(reconcile, error_policy, Arc::new(cms.clone()))
    .for_each(|_| async {});
    let running = tokio::spawn(controller);
    cms.create(
        &PostParams::default(),
        &mk_cm("managed", json!({"managed": "true"}), "1")?,
    )
    .await?;
    cms.create(&PostParams::default(), &mk_cm("unmanaged", json!({}), "1")?)
        .await?;
    eventually(|| async {
        Ok(cms
            .get("managed")
            .await?
            .labels()
            .contains_key("reconciled")
            .then_some(()))
    })
    .await?;
    assert!(
        !cms.get("unmanaged")
            .await?
            .labels()
            .contains_key("reconciled")
    );
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(30), running).await??;
    Ok(())
}
