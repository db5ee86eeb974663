//! The guest's NAD mapping: on which guest interface each Harvester VM network (a Multus
//! NetworkAttachmentDefinition) is, kept in the guest's `kube-system/harvester-nad-mapping`
//! ConfigMap (key `interface-nad-mapping`, a JSON map such as `{"default/vlan10":"enp2s0"}`), as the
//! Harvester Cloud Provider's VMI controller keeps it. The reconciler reads it to tell kube-vip which
//! interface a Service's network is on (`kube-vip.io/serviceInterface`, [`super::network`]).
//!
//! The mapping is built as upstream's VMI controller builds it (`pkg/utils/vmi.go`,
//! `syncNADMappingConfigMap`), from the VirtualMachineInstances of the cloud-config's namespace on
//! Harvester labelled `guestcluster.harvesterhci.io/name=<cluster>`:
//! - a VMI counts when it is Running, not migrating (no migration, or a completed one), and its
//!   guest agent reports interfaces;
//! - each such VMI joins `spec.networks` (NIC name → Multus network name, as written) with
//!   `status.interfaces` (NIC name → the guest's interface name); the mapping keeps the pairs that
//!   every one has, on the same interface, so kube-vip finds the network where it is on whichever
//!   node holds the address;
//! - with no VMI that counts, or nothing in common, the value is emptied (`""`);
//! - nothing is synced for a cluster named `""` or `kubernetes` (the framework default, which
//!   cannot tell clusters apart).
//!
//! Where it differs from upstream (which syncs when one of the guest's node VMIs changes):
//! - It syncs after every burst of changes of the cluster's VMIs (a deletion too) and every 30 s.
//! - While the namespace has no VMI labelled for the cluster at all (a custom cluster, whose VMs
//!   Rancher did not make), nothing is written: upstream never syncs such a cluster either.
//! - The ConfigMap is written only when its value changes, and read and written only by name (no
//!   right to list or watch `kube-system`'s ConfigMaps needed). A change of what it holds (written
//!   here, or by someone else) wakes the Services that name a network; one changed or deleted by
//!   someone else is written again.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{reflector, watcher::Event as WatchEvent};
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::mapping::GuestContext;
use crate::{
    crd::{
        keys::{self, MANAGED_BY, MANAGED_BY_LABEL},
        kinds::VirtualMachineInstance,
    },
    store::{Api, Kind, ObjectStore, StoreError, watcher::watcher},
};

/// VMI changes come in bursts (a node boots, its guest agent reports NIC after NIC): one write per
/// burst.
const SETTLE: Duration = Duration::from_millis(200);
/// How often the ConfigMap is read again when nothing else happens.
pub const RECHECK: Duration = Duration::from_secs(30);
/// Pauses before retrying a failed read or write: doubling from the first to the last.
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(300);
/// Attempts at a write that keeps meeting a newer version of the ConfigMap.
const WRITE_ATTEMPTS: usize = 4;

/// Whether `vmi` is a node of guest cluster `cluster`: labelled with its name.
pub(crate) fn is_node_of(vmi: &VirtualMachineInstance, cluster: &str) -> bool {
    !cluster.is_empty() && vmi.label(keys::LABEL_GUEST_CLUSTER_NAME) == Some(cluster)
}

/// Whether the NAD mapping of cluster `cluster` is kept at all: not for an empty name or the
/// framework default, which many clusters may share.
pub fn syncs(cluster: &str) -> bool {
    !super::naming::cluster_name_is_default(cluster)
}

/// Multus network (as written) → guest interface of one VMI; `None` unless it counts: Running, not
/// migrating, and reporting interfaces.
pub fn interfaces(vmi: &VirtualMachineInstance) -> Option<BTreeMap<String, String>> {
    let running = vmi.pointer("/status/phase").and_then(Value::as_str) == Some("Running");
    let migrated = match vmi.pointer("/status/migrationState") {
        None | Some(Value::Null) => true,
        Some(state) => state.get("completed").and_then(Value::as_bool) == Some(true),
    };
    let reported = vmi
        .pointer("/status/interfaces")
        .and_then(Value::as_array)
        .filter(|i| !i.is_empty())?;
    if !running || !migrated {
        return None;
    }
    let networks: HashMap<&str, &str> = vmi
        .pointer("/spec/networks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|n| {
            let nad = n.pointer("/multus/networkName").and_then(Value::as_str)?;
            Some((
                n.get("name").and_then(Value::as_str).unwrap_or_default(),
                nad,
            ))
        })
        .collect();
    let mut map = BTreeMap::new();
    for i in reported {
        let nic = i.get("name").and_then(Value::as_str).unwrap_or_default();
        let guest = i
            .get("interfaceName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if nic.is_empty() || guest.is_empty() {
            continue;
        }
        if let Some(nad) = networks.get(nic) {
            map.insert(nad.to_string(), guest.to_string());
        }
    }
    Some(map)
}

/// The pairs every map has (same NAD, same interface); empty when there are no maps.
pub fn common(
    maps: impl IntoIterator<Item = BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    maps.into_iter()
        .reduce(|mut acc, next| {
            acc.retain(|nad, iface| next.get(nad) == Some(iface));
            acc
        })
        .unwrap_or_default()
}

/// The mapping of guest cluster `cluster` from the VMIs of its Harvester namespace; `None` when
/// none of them is labelled for it.
pub(crate) fn cluster_mapping<'a>(
    vmis: impl IntoIterator<Item = &'a VirtualMachineInstance>,
    cluster: &str,
) -> Option<BTreeMap<String, String>> {
    let nodes: Vec<&VirtualMachineInstance> = vmis
        .into_iter()
        .filter(|v| is_node_of(v, cluster))
        .collect();
    if nodes.is_empty() {
        return None;
    }
    Some(common(nodes.into_iter().filter_map(interfaces)))
}

/// The ConfigMap value: compact JSON, keys sorted, as Go's `encoding/json` writes a map; `""` for
/// an empty map, as upstream writes it.
pub fn encode(mapping: &BTreeMap<String, String>) -> String {
    if mapping.is_empty() {
        return String::new();
    }
    serde_json::to_string(mapping).expect("a map of strings encodes")
}

/// Writes `value` into the guest's mapping ConfigMap (creating it), unless it is already there.
/// Returns whether it wrote.
async fn write(config_maps: &Api<ConfigMap>, value: &str) -> Result<bool, StoreError> {
    let mut last = None;
    for _ in 0..WRITE_ATTEMPTS {
        let result = match config_maps
            .get(keys::NAD_MAPPING_NAMESPACE, keys::NAD_MAPPING_NAME)
            .await?
        {
            None => {
                let cm = ConfigMap {
                    metadata: kube::api::ObjectMeta {
                        namespace: Some(keys::NAD_MAPPING_NAMESPACE.into()),
                        name: Some(keys::NAD_MAPPING_NAME.into()),
                        labels: Some(
                            [(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())].into(),
                        ),
                        ..Default::default()
                    },
                    data: Some([(keys::NAD_MAPPING_KEY.to_string(), value.to_string())].into()),
                    ..Default::default()
                };
                config_maps.create(&cm).await
            }
            Some(mut cm) => {
                let data = cm.data.get_or_insert_default();
                if data.get(keys::NAD_MAPPING_KEY).map(String::as_str) == Some(value) {
                    return Ok(false);
                }
                data.insert(keys::NAD_MAPPING_KEY.into(), value.into());
                config_maps.replace(&cm).await
            }
        };
        match result {
            Ok(_) => return Ok(true),
            // Someone else wrote it meanwhile: read again.
            Err(e @ (StoreError::Conflict { .. } | StoreError::AlreadyExists { .. })) => {
                last = Some(e)
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("the loop ran"))
}

/// Keeps guest cluster `cluster`'s mapping ConfigMap (in `guest`) in step with its VMIs (in
/// `harvester`, the cluster's namespace there) until `stop`. `on_change` is called whenever the
/// mapping the guest holds changes (written here, or changed or deleted by someone else and seen on
/// a re-read), so that the Services naming a network are looked at again.
///
/// The ConfigMap is only ever read and written by name, so the ccm needs no right to list or watch
/// `kube-system`'s ConfigMaps: it is read after every burst of VMI changes and every
/// [`RECHECK`] otherwise.
pub async fn run(
    guest: Arc<dyn ObjectStore>,
    harvester: Arc<dyn ObjectStore>,
    cluster: GuestContext,
    on_change: impl Fn() + Send + Sync + 'static,
    stop: CancellationToken,
) {
    if !syncs(&cluster.cluster) {
        // Upstream's refusal, logged once rather than on every VMI change.
        warn!(cluster = %cluster.cluster, "failed to sync NAD mapping ConfigMap: guest cluster name configuration is empty/default, we cannot identify the cluster");
        stop.cancelled().await;
        return;
    }
    let (cache, writer) = reflector::store::<VirtualMachineInstance>();
    let changed = Arc::new(Notify::new());
    let watch = {
        let (changed, name) = (changed.clone(), cluster.cluster.clone());
        reflector::reflector(
            writer,
            watcher::<VirtualMachineInstance>(
                harvester,
                Kind::of::<VirtualMachineInstance>(),
                Some(cluster.lb_namespace.clone()),
            ),
        )
        .take_until(stop.clone().cancelled_owned())
        .for_each(move |e| {
            let relevant = match &e {
                Ok(WatchEvent::InitDone) => true,
                Ok(WatchEvent::Apply(v) | WatchEvent::Delete(v)) => is_node_of(v, &name),
                _ => false,
            };
            if relevant {
                changed.notify_one();
            }
            std::future::ready(())
        })
    };
    let sync = {
        let stop = stop.clone();
        let config_maps = Api::<ConfigMap>::new(guest);
        async move {
            // What the guest held at the last read or write (`None` before the first read).
            let mut seen: Option<Option<String>> = None;
            let mut warned_at: Option<Instant> = None;
            let mut retry = RETRY_FIRST;
            let mut next = tokio::time::Instant::now() + RECHECK;
            loop {
                tokio::select! {
                    _ = changed.notified() => {
                        // VMI changes come in bursts: one pass per burst.
                        tokio::select! {
                            _ = tokio::time::sleep(SETTLE) => {}
                            _ = stop.cancelled() => return,
                        }
                    }
                    _ = tokio::time::sleep_until(next) => {}
                    _ = stop.cancelled() => return,
                }
                let result = sync_once(&config_maps, &cache, &cluster.cluster, &mut seen).await;
                match result {
                    Ok(held_changed) => {
                        if held_changed {
                            on_change();
                        }
                        warned_at = None;
                        retry = RETRY_FIRST;
                        next = tokio::time::Instant::now() + RECHECK;
                    }
                    Err(e) => {
                        // Logged once a minute at most while it keeps failing (a missing
                        // kube-system, no rights on the ConfigMap).
                        if warned_at.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                            warn!(cluster = %cluster.cluster, error = %e, "cannot read or write the NAD mapping ConfigMap; retrying");
                            warned_at = Some(Instant::now());
                        }
                        next = tokio::time::Instant::now() + retry;
                        retry = (retry * 2).min(RETRY_MAX);
                    }
                }
            }
        }
    };
    tokio::join!(watch, sync);
}

/// One pass: reads what the guest holds, writes the VMIs' mapping if it differs. Returns whether
/// what the guest holds changed since the last pass (the first read is not a change).
async fn sync_once(
    config_maps: &Api<ConfigMap>,
    vmis: &reflector::Store<VirtualMachineInstance>,
    cluster: &str,
    seen: &mut Option<Option<String>>,
) -> Result<bool, StoreError> {
    let held = config_maps
        .get(keys::NAD_MAPPING_NAMESPACE, keys::NAD_MAPPING_NAME)
        .await?
        .map(|cm| {
            cm.data
                .and_then(|mut d| d.remove(keys::NAD_MAPPING_KEY))
                .unwrap_or_default()
        });
    let mut changed = seen.as_ref().is_some_and(|s| *s != held);
    *seen = Some(held.clone());
    let Some(mapping) = cluster_mapping(vmis.state().iter().map(|v| &**v), cluster) else {
        debug!(%cluster, "no VMI labelled for the cluster; NAD mapping left as it is");
        return Ok(changed);
    };
    let value = encode(&mapping);
    if held.as_deref() != Some(value.as_str()) && write(config_maps, &value).await? {
        info!(%cluster, mapping = %value, "NAD mapping updated");
        *seen = Some(Some(value));
        changed = true;
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vmi(
        name: &str,
        labels: Value,
        phase: &str,
        nics: &[(&str, Option<&str>, Option<&str>)],
    ) -> VirtualMachineInstance {
        // nics: (NIC name, Multus network or pod network, guest interface reported)
        let networks: Vec<Value> = nics
            .iter()
            .map(|(nic, nad, _)| match nad {
                Some(nad) => json!({"name": nic, "multus": {"networkName": nad}}),
                None => json!({"name": nic, "pod": {}}),
            })
            .collect();
        let interfaces: Vec<Value> = nics
            .iter()
            .filter_map(|(nic, _, iface)| {
                iface.map(|i| json!({"name": nic, "interfaceName": i, "ipAddress": "10.0.0.5"}))
            })
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "gc-ns", "labels": labels},
            "spec": {"networks": networks},
            "status": {"phase": phase, "interfaces": interfaces},
        }))
        .expect("vmi")
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    // What counts and how a VMI maps: pkg/utils/vmi.go (GetCommonVMINADs,
    // getNADToInterfaceMapping, IsRunning, IsMigrationCompleted).
    #[test]
    fn a_vmi_counts_when_running_not_migrating_and_reporting_interfaces() {
        let v = vmi(
            "n1",
            json!({}),
            "Running",
            &[
                ("default", None, Some("eth0")),
                ("nic-1", Some("default/vlan10"), Some("enp2s0")),
                ("nic-2", Some("vlan20"), Some("enp3s0")),
                ("nic-3", Some("default/vlan30"), None),
                ("nic-4", Some(""), Some("enp5s0")),
            ],
        );
        assert_eq!(
            interfaces(&v),
            Some(map(&[
                ("", "enp5s0"),
                ("default/vlan10", "enp2s0"),
                ("vlan20", "enp3s0")
            ])),
            "the pod network and NICs not reported are left out; names are used as written"
        );
        let pod_only = vmi(
            "n3",
            json!({}),
            "Running",
            &[("default", None, Some("eth0"))],
        );
        assert_eq!(interfaces(&pod_only), Some(map(&[])));
        let silent = vmi(
            "n4",
            json!({}),
            "Running",
            &[("nic-1", Some("default/vlan10"), None)],
        );
        assert_eq!(interfaces(&silent), None, "no interfaces reported");
        let stopped = vmi(
            "n1",
            json!({}),
            "Scheduling",
            &[("nic-1", Some("default/vlan10"), Some("enp2s0"))],
        );
        assert_eq!(interfaces(&stopped), None);
        let mut migrating = vmi(
            "n1",
            json!({}),
            "Running",
            &[("nic-1", Some("default/vlan10"), Some("enp2s0"))],
        );
        migrating.rest["status"]["migrationState"] = json!({"completed": false});
        assert_eq!(interfaces(&migrating), None);
        migrating.rest["status"]["migrationState"] = json!({"completed": true});
        assert_eq!(
            interfaces(&migrating),
            Some(map(&[("default/vlan10", "enp2s0")]))
        );
        // A VMI being deleted still counts while it runs.
        let mut deleting = migrating.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(interfaces(&deleting).is_some());
    }

    #[test]
    fn the_mapping_is_what_every_node_has_on_the_same_interface() {
        // The example of pkg/utils/vmi.go (GetCommonVMINADs): net123 on different interfaces.
        assert_eq!(
            common([
                map(&[("default/mgmt", "enp1s0"), ("default/net123", "enp2s0")]),
                map(&[("default/mgmt", "enp1s0"), ("default/net123", "enp3s0")]),
            ]),
            map(&[("default/mgmt", "enp1s0")])
        );
        assert_eq!(common(Vec::new()), map(&[]));
        assert_eq!(
            common([
                map(&[
                    ("default/a", "enp1s0"),
                    ("default/b", "enp2s0"),
                    ("default/c", "enp3s0")
                ]),
                map(&[("default/a", "enp1s0"), ("default/b", "enp4s0")]),
            ]),
            map(&[("default/a", "enp1s0")]),
            "b is elsewhere on one node, c missing on one"
        );
    }

    #[test]
    fn the_cluster_s_nodes_by_label_only() {
        let nic = [("nic-1", Some("default/vlan10"), Some("enp2s0"))];
        let labelled = vmi(
            "node-a",
            json!({"guestcluster.harvesterhci.io/name": "gc1"}),
            "Running",
            &nic,
        );
        let legacy = vmi(
            "gc1-pool1-xyz",
            json!({"harvesterhci.io/creator": "docker-machine-driver-harvester"}),
            "Running",
            &[("nic-1", Some("default/vlan10"), Some("enp9s0"))],
        );
        let other = vmi(
            "gc2-pool1-xyz",
            json!({"guestcluster.harvesterhci.io/name": "gc2"}),
            "Running",
            &[("nic-1", Some("default/vlan10"), Some("enp9s0"))],
        );
        let booting = vmi(
            "node-b",
            json!({"guestcluster.harvesterhci.io/name": "gc1"}),
            "Scheduled",
            &nic,
        );
        // pkg/controller/virtualmachineinstance/controller.go (syncNADMappingConfigMap): listed by
        // the cluster label alone.
        assert!(is_node_of(&labelled, "gc1"));
        assert!(!is_node_of(&legacy, "gc1") && !is_node_of(&other, "gc1"));
        assert!(!is_node_of(&labelled, ""));
        assert_eq!(
            cluster_mapping([&labelled, &legacy, &other, &booting], "gc1"),
            Some(map(&[("default/vlan10", "enp2s0")]))
        );
        assert_eq!(
            cluster_mapping([&booting, &other], "gc1"),
            Some(map(&[])),
            "no VMI of the cluster counts: emptied"
        );
        assert_eq!(
            cluster_mapping([&other, &legacy], "gc1"),
            None,
            "none labelled"
        );
        // Refused for the framework default and an empty name.
        assert!(!syncs("kubernetes") && !syncs("") && syncs("gc1"));
    }

    #[test]
    fn the_value_is_compact_sorted_json() {
        assert_eq!(
            encode(&map(&[
                ("default/net123", "enp2s0"),
                ("default/mgmt-vlan1", "enp1s0")
            ])),
            r#"{"default/mgmt-vlan1":"enp1s0","default/net123":"enp2s0"}"#
        );
        // pkg/controller/virtualmachineinstance/controller.go: an empty mapping is written as "".
        assert_eq!(encode(&map(&[])), "");
    }
}
