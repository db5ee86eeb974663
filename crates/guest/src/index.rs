//! Who shares whose address, as two pure indexes the reconciler keeps beside its caches:
//!
//! - [`ShareIndex`], kept from the Service watch ([`ShareIndex::apply`], [`ShareIndex::delete`],
//!   [`ShareIndex::reset`] on a relist): which Services name which primary, so that a change of one
//!   says which others to wake (a primary getting its address, a secondary going away from a primary
//!   whose deletion waits for it).
//! - [`Accepted`], kept by the reconciler: the secondaries it accepted whose label the cache may not
//!   show yet, so that two secondaries checked one right after the other see each other's ports.
//! - [`GroupIndex`], kept from the Service watch like [`ShareIndex`]: which Services give which
//!   sharing key, so that a change of one member (its ports, its requests, its going) wakes the
//!   others (a Service refused for a clash is admitted once the holder goes).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::ObjectRef;

use super::{decide::primary_of, mapping::service_key};
use crate::sharing::sharing_key;

/// Which Services name which primary (by their annotation).
#[derive(Debug, Default)]
pub struct ShareIndex {
    /// Primary key → the Services whose annotation names it.
    named_by: HashMap<String, HashSet<ObjectRef<Service>>>,
    /// Service → the primary key its annotation names.
    names: HashMap<ObjectRef<Service>, String>,
}

impl ShareIndex {
    /// `svc` was created or changed: returns the Services to wake, those naming it and the primary
    /// it named before if it no longer does.
    pub fn apply(&mut self, svc: &Service) -> Vec<ObjectRef<Service>> {
        let names = primary_of(svc)
            .ok()
            .flatten()
            .map(|(ns, name)| format!("{ns}/{name}"));
        self.record(svc, names)
    }

    /// `svc` was deleted: returns the Services to wake, those naming it and the primary it named.
    pub fn delete(&mut self, svc: &Service) -> Vec<ObjectRef<Service>> {
        self.record(svc, None)
    }

    /// The watch lists again: what it applies next is all there is.
    pub fn reset(&mut self) {
        *self = ShareIndex::default();
    }

    /// How many Services name a primary.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    fn record(&mut self, svc: &Service, now: Option<String>) -> Vec<ObjectRef<Service>> {
        let me = ObjectRef::from_obj(svc);
        let before = self.names.remove(&me);
        let mut wake: Vec<ObjectRef<Service>> = self
            .named_by
            .get(&service_key(svc))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        if let Some(before) = before
            && Some(&before) != now.as_ref()
        {
            if let Some(set) = self.named_by.get_mut(&before) {
                set.remove(&me);
                if set.is_empty() {
                    self.named_by.remove(&before);
                }
            }
            if let Some((ns, name)) = before.split_once('/') {
                wake.push(ObjectRef::new(name).within(ns));
            }
        }
        if let Some(now) = now {
            self.named_by
                .entry(now.clone())
                .or_default()
                .insert(me.clone());
            self.names.insert(me, now);
        }
        wake
    }
}

/// Which Services give which sharing key (`<namespace>/<key>`), with what each asks of the group.
#[derive(Debug, Default)]
pub struct GroupIndex {
    /// Group → its Services.
    members: HashMap<String, HashSet<ObjectRef<Service>>>,
    /// Service → its group and the fingerprint of what it asks.
    of: HashMap<ObjectRef<Service>, (String, u64)>,
}

/// What a Service's membership of a group depends on: its metadata but the resourceVersion and
/// status, and its spec.
fn membership_fingerprint(svc: &Service) -> u64 {
    use std::hash::{Hash, Hasher};
    let m = &svc.metadata;
    let relevant = (
        &m.uid,
        &m.labels,
        &m.annotations,
        m.deletion_timestamp.is_some(),
        serde_json::to_string(&svc.spec).ok(),
    );
    let mut h = std::collections::hash_map::DefaultHasher::new();
    relevant.hash(&mut h);
    h.finish()
}

impl GroupIndex {
    /// `svc` was created or changed: returns the other Services of its group, and of the group it
    /// left, when what it asks changed; and the group it left (`<namespace>/<key>`), whose
    /// LoadBalancer may have no Service left.
    pub fn apply(&mut self, svc: &Service) -> (Vec<ObjectRef<Service>>, Option<String>) {
        let group = sharing_key(svc).ok().flatten().map(|k| {
            format!(
                "{}/{}",
                svc.metadata.namespace.as_deref().unwrap_or_default(),
                k.value
            )
        });
        let now = group.map(|g| (g, membership_fingerprint(svc)));
        self.record(svc, now)
    }

    /// `svc` was deleted: returns the other Services of its group, and the group.
    pub fn delete(&mut self, svc: &Service) -> (Vec<ObjectRef<Service>>, Option<String>) {
        self.record(svc, None)
    }

    /// The watch lists again: what it applies next is all there is.
    pub fn reset(&mut self) {
        *self = GroupIndex::default();
    }

    /// The Services of group `<namespace>/<key>`.
    pub fn members(&self, group: &str) -> Vec<ObjectRef<Service>> {
        self.members
            .get(group)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn record(
        &mut self,
        svc: &Service,
        now: Option<(String, u64)>,
    ) -> (Vec<ObjectRef<Service>>, Option<String>) {
        let me = ObjectRef::from_obj(svc);
        let before = self.of.remove(&me);
        if before == now {
            if let Some(now) = now {
                self.of.insert(me, now);
            }
            return (Vec::new(), None);
        }
        let left = before
            .as_ref()
            .map(|(group, _)| group.clone())
            .filter(|group| now.as_ref().map(|(g, _)| g) != Some(group));
        let mut wake = HashSet::new();
        if let Some((group, _)) = &before
            && let Some(set) = self.members.get_mut(group)
        {
            set.remove(&me);
            wake.extend(set.iter().cloned());
            if set.is_empty() {
                self.members.remove(group);
            }
        }
        if let Some((group, fingerprint)) = now {
            let set = self.members.entry(group.clone()).or_default();
            wake.extend(set.iter().cloned());
            set.insert(me.clone());
            self.of.insert(me, (group, fingerprint));
        }
        let mut wake: Vec<_> = wake.into_iter().collect();
        wake.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        (wake, left)
    }
}

/// The secondaries this process accepted, by primary.
#[derive(Debug, Default)]
pub struct Accepted {
    /// Primary key → secondary key → the secondary as accepted.
    by_primary: HashMap<String, BTreeMap<String, Arc<Service>>>,
    /// Secondary key → its primary's key.
    primary_of: HashMap<String, String>,
}

impl Accepted {
    /// `svc` (key `key`) now shares `primary`'s address, and no other's.
    pub fn accept(&mut self, primary: &str, key: &str, svc: &Service) {
        self.forget(key);
        self.by_primary
            .entry(primary.to_string())
            .or_default()
            .insert(key.to_string(), Arc::new(svc.clone()));
        self.primary_of.insert(key.to_string(), primary.to_string());
    }

    /// `key` shares no address any more (refused, gone, a primary now).
    pub fn forget(&mut self, key: &str) {
        if let Some(primary) = self.primary_of.remove(key)
            && let Some(secondaries) = self.by_primary.get_mut(&primary)
        {
            secondaries.remove(key);
            if secondaries.is_empty() {
                self.by_primary.remove(&primary);
            }
        }
    }

    /// The secondaries accepted for `primary`, by key.
    pub fn of(&self, primary: &str) -> Vec<(String, Arc<Service>)> {
        self.by_primary
            .get(primary)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.primary_of.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::keys;

    fn mk_svc(ns: &str, name: &str, primary: Option<&str>) -> Service {
        let mut svc = Service::default();
        svc.metadata.namespace = Some(ns.into());
        svc.metadata.name = Some(name.into());
        svc.metadata.uid = Some(format!("uid-{name}"));
        if let Some(p) = primary {
            svc.metadata.annotations =
                Some([(keys::SVC_PRIMARY.to_string(), p.to_string())].into());
        }
        svc
    }

    fn mk_ref(ns: &str, name: &str) -> ObjectRef<Service> {
        ObjectRef::new(name).within(ns)
    }

    #[test]
    fn a_change_wakes_who_depends_on_it() {
        let mut index = ShareIndex::default();
        let primary = mk_svc("default", "p", None);
        let secondary = mk_svc("default", "s", Some("p"));
        assert!(index.apply(&primary).is_empty());
        assert!(index.apply(&secondary).is_empty());
        // The primary changes: its secondary wakes.
        assert_eq!(index.apply(&primary), [mk_ref("default", "s")]);
        // The secondary goes: the primary (whose deletion may wait for it) wakes.
        assert_eq!(index.delete(&secondary), [mk_ref("default", "p")]);
        assert!(index.apply(&primary).is_empty());
        assert!(index.is_empty());
    }

    #[test]
    fn naming_another_primary_wakes_the_old_one() {
        let mut index = ShareIndex::default();
        index.apply(&mk_svc("default", "s", Some("p1")));
        // A bare name is in the secondary's namespace; `ns/name` names another one.
        assert_eq!(
            index.apply(&mk_svc("default", "s", Some("other/p2"))),
            [mk_ref("default", "p1")]
        );
        assert_eq!(
            index.apply(&mk_svc("other", "p2", None)),
            [mk_ref("default", "s")]
        );
        // No longer a secondary: the last primary wakes, and nobody names it any more.
        assert_eq!(
            index.apply(&mk_svc("default", "s", None)),
            [mk_ref("other", "p2")]
        );
        assert!(index.apply(&mk_svc("other", "p2", None)).is_empty());
    }

    #[test]
    fn a_relist_starts_over() {
        let mut index = ShareIndex::default();
        index.apply(&mk_svc("default", "s", Some("p")));
        assert_eq!(index.len(), 1);
        index.reset();
        assert!(index.apply(&mk_svc("default", "p", None)).is_empty());
    }

    fn mk_member(name: &str, key: Option<&str>, port: i32) -> Service {
        let mut svc = mk_svc("default", name, None);
        svc.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![k8s_openapi::api::core::v1::ServicePort {
                port,
                ..Default::default()
            }]),
            ..Default::default()
        });
        if let Some(k) = key {
            svc.metadata.annotations =
                Some([(keys::METALLB_SHARING_KEY.to_string(), k.to_string())].into());
        }
        svc
    }

    #[test]
    fn a_member_s_change_wakes_the_others_of_its_groups() {
        let mut index = GroupIndex::default();
        let none = |v: Vec<ObjectRef<Service>>| (v, None::<String>);
        assert_eq!(index.apply(&mk_member("a", Some("k"), 80)), none(vec![]));
        assert_eq!(
            index.apply(&mk_member("b", Some("k"), 80)),
            none(vec![mk_ref("default", "a")])
        );
        // The same again (a status write): nobody wakes.
        assert_eq!(index.apply(&mk_member("b", Some("k"), 80)), none(vec![]));
        // Its ports change: the others look again.
        assert_eq!(
            index.apply(&mk_member("a", Some("k"), 81)),
            none(vec![mk_ref("default", "b")])
        );
        assert_eq!(index.members("default/k").len(), 2);
        // Moving to another key wakes the group it left (and the new one, empty here), and says
        // which it left.
        assert_eq!(
            index.apply(&mk_member("a", Some("other"), 81)),
            (vec![mk_ref("default", "b")], Some("default/k".into()))
        );
        // A Service without a key is in no group; its going wakes nobody.
        assert_eq!(index.apply(&mk_member("c", None, 80)), none(vec![]));
        assert_eq!(index.delete(&mk_member("c", None, 80)), none(vec![]));
        // Dropping its key, b leaves its group (of which it was the last).
        assert_eq!(
            index.apply(&mk_member("b", None, 80)),
            (vec![], Some("default/k".into()))
        );
        // The holder goes: the one refused for clashing with it wakes.
        index.apply(&mk_member("d", Some("other"), 81));
        assert_eq!(
            index.delete(&mk_member("a", Some("other"), 81)),
            (vec![mk_ref("default", "d")], Some("default/other".into()))
        );
        index.reset();
        assert!(index.members("default/k").is_empty());
    }

    #[test]
    fn accepted_secondaries_follow_their_last_primary() {
        let mut accepted = Accepted::default();
        let s = mk_svc("default", "s", Some("p1"));
        accepted.accept("default/p1", "default/s", &s);
        accepted.accept(
            "default/p1",
            "default/t",
            &mk_svc("default", "t", Some("p1")),
        );
        let keys = |a: &Accepted, p: &str| -> Vec<String> {
            a.of(p).into_iter().map(|(k, _)| k).collect()
        };
        assert_eq!(keys(&accepted, "default/p1"), ["default/s", "default/t"]);
        // Accepted for another primary: no longer counted for the first.
        accepted.accept("default/p2", "default/s", &s);
        assert_eq!(keys(&accepted, "default/p1"), ["default/t"]);
        assert_eq!(keys(&accepted, "default/p2"), ["default/s"]);
        accepted.forget("default/s");
        accepted.forget("default/t");
        assert!(accepted.is_empty() && accepted.of("default/p1").is_empty());
    }
}
