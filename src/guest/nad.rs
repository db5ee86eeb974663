//! The guest's NAD mapping: on which guest interface each Harvester VM network (a Multus
//! NetworkAttachmentDefinition) is, kept in the guest's `kube-system/harvester-nad-mapping`
//! ConfigMap (key `interface-nad-mapping`, a JSON map such as `{"default/vlan10":"enp2s0"}`), as the
//! Harvester Cloud Provider's VMI controller keeps it. The reconciler reads it to tell kube-vip which
//! interface a Service's network is on (`kube-vip.io/serviceInterface`, [`super::network`]).
//!
//! The mapping is built from the guest cluster's VirtualMachineInstances on Harvester: each Running
//! VMI joins `spec.networks` (NIC name → NAD) with `status.interfaces` (NIC name → the guest's
//! interface name, which the guest agent reports); the mapping keeps the pairs that every such VMI
//! has, on the same interface, so kube-vip finds the network where it is on whichever node holds the
//! address. NICs on the pod network, and NICs the guest agent has not reported yet, are left out.
//!
//! Choices where upstream says nothing:
//! - A VMI is one of the cluster's when it carries `guestcluster.harvesterhci.io/name=<cluster>`, or
//!   (legacy) Rancher's node driver made it and its name starts with `<cluster>-` (as the node driver
//!   names VMs). Harvester's findNetwork takes any name starting with the cluster name; here that
//!   would let `gc10-…` shrink the mapping of `gc1`.
//! - A Running VMI whose guest agent has not yet reported every Multus NIC (a node booting) is left
//!   out until it has: counting it would empty the mapping, and refuse every Service naming a
//!   network, on each boot or scale-up.
//! - A bare `networkName` (no namespace) means the VMI's namespace, as KubeVirt reads it, so keys are
//!   always `namespace/name`, as Services name networks.
//! - With no Running VMI of the cluster (all stopped, or none yet), the ConfigMap is left as it is:
//!   the interfaces of the VMs do not change while they are down, and an empty map would refuse every
//!   Service that names a network.
//! - The ConfigMap is written only when its value changes, and read and written only by name (no
//!   right to list or watch `kube-system`'s ConfigMaps needed): after each burst of VMI changes and
//!   every 30 s. A change of what it holds (written here, or by someone else) wakes the Services that
//!   name a network; one changed or deleted by someone else is written again.

use std::{
    collections::BTreeMap,
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
    controller::kinds::VirtualMachineInstance,
    crd::keys,
    kubeconfig::objects::{MANAGED_BY, MANAGED_BY_LABEL},
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

/// Whether `vmi` is a node of guest cluster `cluster`.
pub fn is_node_of(vmi: &VirtualMachineInstance, cluster: &str) -> bool {
    if cluster.is_empty() {
        return false;
    }
    if vmi.label(keys::LABEL_GUEST_CLUSTER_NAME) == Some(cluster) {
        return true;
    }
    vmi.label(keys::LABEL_CREATOR) == Some(keys::NODE_DRIVER)
        && vmi
            .metadata
            .name
            .as_deref()
            .and_then(|n| n.strip_prefix(cluster))
            .is_some_and(|rest| rest.starts_with('-'))
}

/// NAD (`namespace/name`) → guest interface of one VMI; `None` unless it is Running, not being
/// deleted, and its guest agent has reported the interface of every Multus NIC.
pub fn interfaces(vmi: &VirtualMachineInstance) -> Option<BTreeMap<String, String>> {
    if vmi.metadata.deletion_timestamp.is_some()
        || vmi.pointer("/status/phase").and_then(Value::as_str) != Some("Running")
    {
        return None;
    }
    let namespace = vmi.metadata.namespace.as_deref().unwrap_or_default();
    let reported: BTreeMap<&str, &str> = vmi
        .pointer("/status/interfaces")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|i| {
            let nic = i.get("name").and_then(Value::as_str)?;
            let guest = i.get("interfaceName").and_then(Value::as_str)?;
            (!nic.is_empty() && !guest.is_empty()).then_some((nic, guest))
        })
        .collect();
    let mut map = BTreeMap::new();
    for n in vmi
        .pointer("/spec/networks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(nad) = n
            .pointer("/multus/networkName")
            .and_then(Value::as_str)
            .filter(|nad| !nad.is_empty())
        else {
            continue;
        };
        let nad = match nad.split_once('/') {
            Some(_) => nad.to_string(),
            None => format!("{namespace}/{nad}"),
        };
        let nic = n.get("name").and_then(Value::as_str).unwrap_or_default();
        // Not reported yet: this VMI's mapping is not known.
        let guest = reported.get(nic)?;
        map.insert(nad, guest.to_string());
    }
    Some(map)
}

/// The pairs every map has (same NAD, same interface); `None` when there are no maps.
pub fn common(
    maps: impl IntoIterator<Item = BTreeMap<String, String>>,
) -> Option<BTreeMap<String, String>> {
    maps.into_iter().reduce(|mut acc, next| {
        acc.retain(|nad, iface| next.get(nad) == Some(iface));
        acc
    })
}

/// The mapping of guest cluster `cluster` from the VMIs of its Harvester namespace; `None` when none
/// of its VMIs is running.
pub fn cluster_mapping<'a>(
    vmis: impl IntoIterator<Item = &'a VirtualMachineInstance>,
    cluster: &str,
) -> Option<BTreeMap<String, String>> {
    common(
        vmis.into_iter()
            .filter(|v| is_node_of(v, cluster))
            .filter_map(interfaces),
    )
}

/// The ConfigMap value: compact JSON, keys sorted, as Go's `encoding/json` writes a map.
pub fn encode(mapping: &BTreeMap<String, String>) -> String {
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
        debug!(%cluster, "no running VMI of the cluster; NAD mapping left as it is");
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

    #[test]
    fn a_running_vmi_maps_its_multus_nics_to_the_reported_interfaces() {
        let v = vmi(
            "n1",
            json!({}),
            "Running",
            &[
                ("default", None, Some("eth0")),
                ("nic-1", Some("default/vlan10"), Some("enp2s0")),
                ("nic-2", Some("vlan20"), Some("enp3s0")),
                ("nic-4", Some(""), Some("enp5s0")),
            ],
        );
        assert_eq!(
            interfaces(&v),
            Some(map(&[
                ("default/vlan10", "enp2s0"),
                ("gc-ns/vlan20", "enp3s0")
            ])),
            "pod network and empty names are left out; a bare name is the VMI's namespace"
        );
        let booting = vmi(
            "n2",
            json!({}),
            "Running",
            &[
                ("nic-1", Some("default/vlan10"), Some("enp2s0")),
                ("nic-3", Some("default/vlan30"), None),
            ],
        );
        assert_eq!(interfaces(&booting), None, "a Multus NIC not reported yet");
        let no_multus = vmi("n3", json!({}), "Running", &[("default", None, None)]);
        assert_eq!(interfaces(&no_multus), Some(map(&[])));
        let stopped = vmi(
            "n1",
            json!({}),
            "Scheduling",
            &[("nic-1", Some("default/vlan10"), Some("enp2s0"))],
        );
        assert_eq!(interfaces(&stopped), None);
        let mut deleting = vmi(
            "n1",
            json!({}),
            "Running",
            &[("nic-1", Some("default/vlan10"), Some("enp2s0"))],
        );
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(interfaces(&deleting), None);
    }

    #[test]
    fn the_mapping_is_what_every_node_has_on_the_same_interface() {
        assert_eq!(common(Vec::new()), None);
        assert_eq!(
            common([
                map(&[
                    ("default/a", "enp1s0"),
                    ("default/b", "enp2s0"),
                    ("default/c", "enp3s0")
                ]),
                map(&[("default/a", "enp1s0"), ("default/b", "enp4s0")]),
                map(&[
                    ("default/a", "enp1s0"),
                    ("default/b", "enp2s0"),
                    ("default/c", "enp3s0")
                ]),
            ]),
            Some(map(&[("default/a", "enp1s0")])),
            "b is elsewhere on one node, c missing on one"
        );
        assert_eq!(
            common([map(&[("default/a", "enp1s0")]), map(&[])]),
            Some(map(&[])),
            "nothing in common is an empty map"
        );
    }

    #[test]
    fn the_cluster_s_nodes_by_label_or_legacy_name() {
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
            &nic,
        );
        let other = vmi(
            "gc2-pool1-xyz",
            json!({"guestcluster.harvesterhci.io/name": "gc2"}),
            "Running",
            &[("nic-1", Some("default/vlan10"), Some("enp9s0"))],
        );
        let unlabelled = vmi("gc1-by-hand", json!({}), "Running", &nic);
        let longer_name = vmi(
            "gc10-pool1-xyz",
            json!({"harvesterhci.io/creator": "docker-machine-driver-harvester"}),
            "Running",
            &nic,
        );
        assert!(!is_node_of(&longer_name, "gc1"), "gc10's node is not gc1's");
        assert!(is_node_of(&labelled, "gc1") && is_node_of(&legacy, "gc1"));
        assert!(!is_node_of(&other, "gc1") && !is_node_of(&unlabelled, "gc1"));
        assert!(!is_node_of(&labelled, ""));
        assert_eq!(
            cluster_mapping([&labelled, &legacy, &other, &unlabelled], "gc1"),
            Some(map(&[("default/vlan10", "enp2s0")]))
        );
        assert_eq!(cluster_mapping([&other], "gc1"), None);
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
    }
}
