"""The differential corpus: IPPool/LoadBalancer sequences applied, step by step, to upstream's load
balancer controller and to this service, each on its own control plane; after every step both
sides settle and their normalized state is compared.

Objects are written as Harvester's admission webhooks would have left them (the `global-ip-pool`
and `vid` labels on pools, the namespace/project/network annotations and health-check defaults on
load balancers), and no webhook runs on either side, so what is compared is the two reconcilers.

Compared per step: every IPPool's status (total, available, lastAllocated, allocated,
allocatedHistory, the Ready condition's status and message, being deleted), every LoadBalancer's
status (allocatedAddress, address, backendServers, Ready status and message, being deleted), the
Services and EndpointSlices of VM load balancers (loadBalancerIP, ports, endpoint addresses and
readiness) and the Events on these objects. Condition `reason`s, timestamps and condition types
other than Ready are left out (upstream writes none of them). Every sequence ends by deleting its
LoadBalancers, compared too (leaks show there)."""

import json
import re
import threading
import time

from kube import LB_API, ApiError, dhcp_lease, foreign  # noqa: F401 (dhcp_lease: documented stand-in)

GLOBAL = ("*", "*", "*")
NAMESPACES = ["default", "ns1", "ns2", "ns3", "gc-ns"]

# Known differences, by id: why the two sides differ on purpose (docs/src/load-balancers.md, "Where
# it differs from Harvester on purpose") or by an upstream defect the reference lists.
KNOWN = {
    "empty-allocated-address": "upstream writes `allocatedAddress: {}` on a LoadBalancer its pools cannot serve "
                               "(it copies an empty result into the status); ours leaves the field out",
    "events": "upstream writes no Events; ours writes Allocated, Released, NoMatchedIPPool, PoolExhausted, ... "
              "(reference, Known upstream defects 9)",
    "loose-before-global": "for guest-cluster LoadBalancers ours runs the loose match before the global pool; "
                           "upstream only when no global pool exists (defect 6)",
    "empty-ipam-leak": "upstream releases on delete only when spec.ipam is literally `pool`, so an empty ipam "
                       "leaks its address; ours treats empty as pool (defect 10)",
    "available-shrunk": "after a range shrink below an allocated address, upstream's available is "
                        "total - len(allocated) (the stranded address still counts); ours counts only what it "
                        "can hand out",
    "pool-delete-with-allocations": "upstream drops a pool (and its allocator) at once, so a LoadBalancer still "
                                    "holding one of its addresses can no longer be deleted (`fail to release ip ..., "
                                    "fail to get allocator`); ours keeps the pool until its last address is released",
    "history-fallback": "an address in history that cannot be used is a hard error upstream; ours falls back to a "
                        "fresh address (defect 4)",
    "stale-pool-reference": "a LoadBalancer whose explicit spec.ipPool does not exist: upstream reports "
                            "`fail to get allocator <pool>`; ours reports its own message",
    "exhaustion-wakeup": "a LoadBalancer waiting on an exhausted pool: ours is woken by the next release; upstream "
                         "retries with exponential back-off, so for a while it still shows the error",
    "service-gc": "when a VM load balancer is gone, ours has deleted its Service and EndpointSlice; upstream "
                  "leaves them to the garbage collector (owner references), which takes longer than a step",
    "slash-32-gateway": "a /32 has no gateway: upstream writes the string `<nil>` (Go's String() of a nil IP) as "
                        "allocatedAddress.gateway; ours leaves the gateway out",
    "history-outside-ranges": "an address released after a range change left it outside the pool: upstream records "
                              "it in allocatedHistory (which its IPPool controller prunes at the next range change); "
                              "ours does not",
    "address-follows-service": "a VM load balancer moved to another pool: ours follows its Service's ingress to the "
                               "new address; upstream copied the ingress before kube-vip moved it and is not woken by "
                               "Service changes, so its status.address stays the old address",
    "cluster-address": "a guest cluster's LoadBalancer: ours writes the allocated address into status.address "
                       "itself; upstream leaves it to the guest's cloud provider (the manual's load balancers page "
                       "lists it)",
    "skip-addresses": "a pool annotated `loadbalancer.harvesterhci.io/skipAddresses` (ours, issue 27): ours does not "
                      "hand out what it skips (here an address ending in .255 and one ending in .0); upstream ignores "
                      "the annotation",
    "service-selector": "a pool annotated `loadbalancer.harvesterhci.io/serviceSelector` (ours, issue 27) serves only "
                        "the load balancers whose Service labels match; upstream ignores the annotation and lets it "
                        "serve every load balancer of its scope",
    "sharing-key": "load balancers of one namespace with one `loadbalancer.harvesterhci.io/sharing-key` (ours, "
                   "issue 27) share one address: the pool names one holder, the others carry its address; upstream "
                   "ignores the key and gives each its own",
    "vmi-label-change": "a VMI that stops matching a selector: ours drops it from the EndpointSlice at once; "
                        "upstream wakes only the LoadBalancers matching the VMI's new labels",
}

# --- builders -------------------------------------------------------------------------------

def pool_obj(name, subnet="10.0.0.0/24", start=None, end=None, gw=None, scope=(GLOBAL,), priority=0, network="",
             ranges=None, vid="0", ann=None):
    if ranges is None:
        r = {"subnet": subnet}
        if start:
            r["rangeStart"] = start
        if end:
            r["rangeEnd"] = end
        if gw:
            r["gateway"] = gw
        ranges = [r]
    sel = {}
    if scope is not None:
        sel["scope"] = [{"project": p, "namespace": n, "guestCluster": c} for p, n, c in scope]
    if priority:
        sel["priority"] = priority
    if network:
        sel["network"] = network
    glob = scope is not None and list(scope) == [GLOBAL]
    meta = {"name": name, "labels": {"loadbalancer.harvesterhci.io/global-ip-pool": str(glob).lower(),
                                      "loadbalancer.harvesterhci.io/vid": vid}}
    if ann:
        meta["annotations"] = dict(ann)
    return {
        "apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "IPPool",
        "metadata": meta,
        "spec": {"ranges": ranges, "selector": sel},
    }


LISTENERS = [{"name": "http", "port": 80, "protocol": "TCP", "backendPort": 8080}]


def lb_obj(ns, name, wt="vm", ipam="pool", pool="", network=None, project=None, cluster=None, listeners=None,
           selector=None, hc=None, ann=None, labels=None):
    extra = ann or {}
    ann = {"loadbalancer.harvesterhci.io/namespace": ns}
    ann.update(extra)
    if wt == "cluster":
        # What the mutator writes for a guest cluster's load balancer (project from the namespace,
        # network from findNetwork), and the cloud provider's cluster annotation.
        ann["loadbalancer.harvesterhci.io/project"] = project or ""
        ann["loadbalancer.harvesterhci.io/network"] = network or ""
        if cluster is not None:
            ann["loadbalancer.harvesterhci.io/cluster"] = cluster
    elif network is not None:
        ann["loadbalancer.harvesterhci.io/network"] = network
    spec = {"workloadType": wt}
    if ipam is not None:
        spec["ipam"] = ipam
    if pool:
        spec["ipPool"] = pool
    if wt == "vm":
        spec["listeners"] = listeners if listeners is not None else LISTENERS
    if selector:
        spec["backendServerSelector"] = selector
    if hc:
        spec["healthCheck"] = {"port": hc, "successThreshold": 2, "failureThreshold": 2, "periodSeconds": 1,
                               "timeoutSeconds": 1}
    meta = {"name": name, "namespace": ns, "annotations": ann}
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": "loadbalancer.harvesterhci.io/v1beta1", "kind": "LoadBalancer",
            "metadata": meta, "spec": spec}


def nad_obj(k, ns, name, vlan):
    """A VLAN network as Harvester's network controller writes it, built from
    network-attachment-definition-client's Go types (tools/foreign-crds)."""
    config = json.dumps({"cniVersion": "0.3.1", "name": name, "type": "bridge", "bridge": "mgmt-br", "vlan": vlan})
    return foreign(k, "nad", "-namespace", ns, "-name", name, "-label", f"network.harvesterhci.io/vlan-id={vlan}",
                   "-config", config)


# Steps: tuples whose first item names the action.
def P(*a, **kw):
    return ("pool", pool_obj(*a, **kw))


def L(*a, **kw):
    return ("lb", lb_obj(*a, **kw))


def DL(ns, name):
    return ("lb-delete", ns, name)


def DP(name):
    return ("pool-delete", name)


def VMI(ns, name, labels, ip="10.52.1.10", phase="Running"):
    return ("vmi", ns, name, labels, ip, phase)


def WAIT(ns, name):
    """Wait (up to 60 s) until ns/name has an address on each side before settling."""
    return ("wait-address", ns, name)


class Seq:
    def __init__(self, name, steps, known=(), what="", compare="exact"):
        self.name = name
        self.steps = steps
        self.known = dict(known)  # path regex -> known id
        self.what = what
        self.compare = compare


def sequences():
    s = []
    add = s.append
    # --- pool selection: scopes, priorities, global pools, networks ---
    add(Seq("global-only", [P("g", "10.1.0.0/24", "10.1.0.10", "10.1.0.20"), L("default", "a")],
            what="a VM load balancer in any namespace gets the global pool"))
    add(Seq("ns-scope", [P("p1", "10.1.1.0/24", "10.1.1.10", "10.1.1.20", scope=[("*", "ns1", "*")]),
                         L("ns1", "a"), L("ns2", "b")],
            known={r"lb/ns2/b/aa$": "empty-allocated-address"},
            what="a namespace pool serves its namespace only; the other has no pool"))
    add(Seq("ns-scope-and-global", [P("p1", "10.1.2.0/24", "10.1.2.10", "10.1.2.20", scope=[("*", "ns1", "*")]),
                                    P("g", "10.1.3.0/24", "10.1.3.10", "10.1.3.20"), L("ns1", "a"), L("ns2", "b")],
            what="the namespace pool wins in its namespace, the global pool elsewhere"))
    add(Seq("priority", [P("lo", "10.1.4.0/24", "10.1.4.10", "10.1.4.20", scope=[("*", "ns1", "*")], priority=10),
                         P("hi", "10.1.5.0/24", "10.1.5.10", "10.1.5.20", scope=[("*", "ns1", "*")], priority=20),
                         L("ns1", "a")], what="the higher priority wins"))
    add(Seq("priority-vs-zero", [P("zero", "10.1.6.0/24", "10.1.6.10", "10.1.6.20", scope=[("*", "ns1", "*")]),
                                 P("five", "10.1.7.0/24", "10.1.7.10", "10.1.7.20", scope=[("*", "ns1", "*")], priority=5),
                                 L("ns1", "a")], what="priority 5 over priority 0"))
    add(Seq("explicit-pool", [P("p1", "10.1.8.0/24", "10.1.8.10", "10.1.8.20", scope=[("*", "ns1", "*")]),
                              P("g", "10.1.9.0/24", "10.1.9.10", "10.1.9.20"), L("ns2", "a", pool="p1")],
            what="spec.ipPool is used without matching"))
    add(Seq("explicit-pool-missing", [P("g", "10.1.10.0/24", "10.1.10.10", "10.1.10.20"), L("ns1", "a", pool="nope")],
            known={r"lb/ns1/a/(aa|ready)$": "stale-pool-reference"},
            what="spec.ipPool names no pool"))
    add(Seq("network-match", [("nad", "default", "vlan10", 10),
                              P("net", "10.1.11.0/24", "10.1.11.10", "10.1.11.20", scope=[("*", "*", "*"), ("*", "ns1", "*")],
                                network="default/vlan10", vid="10"),
                              L("ns1", "a", network="default/vlan10"), L("ns1", "b")],
            known={r"lb/ns1/b/aa$": "empty-allocated-address"},
            what="a pool on a network serves only load balancers on that network"))
    add(Seq("global-ignores-network", [("nad", "default", "vlan10", 10),
                                       P("g", "10.1.12.0/24", "10.1.12.10", "10.1.12.20", network="default/vlan10", vid="10"),
                                       L("ns1", "a", network="default/vlan20"), L("ns1", "b")],
            what="the global pool serves whatever the network (upstream defect 6, kept)"))
    add(Seq("project-scope", [P("proj", "10.1.13.0/24", "10.1.13.10", "10.1.13.20", scope=[("p-abc/p-1", "*", "*")]),
                              L("gc-ns", "a", wt="cluster", project="p-abc/p-1", cluster="gc1"),
                              L("gc-ns", "b", wt="cluster", project="p-other", cluster="gc1")],
            known={r"lb/gc-ns/b/aa$": "empty-allocated-address"},
            what="a project pool serves that project's guest clusters"))
    add(Seq("guest-cluster-scope", [P("gcp", "10.1.14.0/24", "10.1.14.10", "10.1.14.20", scope=[("*", "*", "gc1")]),
                                    L("gc-ns", "a", wt="cluster", cluster="gc1"),
                                    L("gc-ns", "b", wt="cluster", cluster="gc2")],
            known={r"lb/gc-ns/b/aa$": "empty-allocated-address"},
            what="a guest-cluster pool serves that cluster only"))
    add(Seq("loose-match", [P("ui", "10.1.15.0/24", "10.1.15.10", "10.1.15.20", scope=[("", "gc-ns", "")]),
                            L("gc-ns", "a", wt="cluster", project="p-1", cluster="gc1")],
            what="a UI-made namespace-only pool serves guest clusters of the namespace (loose match)"))
    add(Seq("loose-vs-global", [P("ui", "10.1.16.0/24", "10.1.16.10", "10.1.16.20", scope=[("", "gc-ns", "")]),
                                P("g", "10.1.17.0/24", "10.1.17.10", "10.1.17.20"),
                                L("gc-ns", "a", wt="cluster", project="p-1", cluster="gc1")],
            known={r"lb/gc-ns/a/aa$": "loose-before-global", r"pool/(ui|g)/(available|lastAllocated|allocated)": "loose-before-global"},
            what="a namespace-only pool and a global pool: which serves a guest cluster"))
    add(Seq("vm-empty-scope-fields", [P("ui", "10.1.18.0/24", "10.1.18.10", "10.1.18.20", scope=[("", "ns1", "")]),
                                      L("ns1", "a")],
            what="a VM load balancer (no project, no cluster) strictly matches a pool with empty fields"))
    add(Seq("multi-tuple-scope", [P("m", "10.1.19.0/24", "10.1.19.10", "10.1.19.20", scope=[("*", "ns1", "*"), ("*", "ns2", "*")]),
                                  L("ns1", "a"), L("ns2", "b"), L("ns3", "c")],
            known={r"lb/ns3/c/aa$": "empty-allocated-address"},
            what="a pool with two scope tuples"))
    add(Seq("no-pools", [L("ns1", "a"), L("gc-ns", "b", wt="cluster", cluster="gc1")],
            known={r"lb/[^/]+/[ab]/aa$": "empty-allocated-address"},
            what="no pool at all"))
    add(Seq("pool-after-lb", [L("ns1", "a"), ("pool", pool_obj("g", "10.1.20.0/24", "10.1.20.10", "10.1.20.20"), ("ns1", "a"))],
            known={r"lb/ns1/a/aa$": "empty-allocated-address"},
            what="a load balancer waiting for a pool gets one when it appears"))
    # --- allocation order ---
    add(Seq("round-robin", [P("g", "10.2.0.0/24", "10.2.0.10", "10.2.0.14"), L("ns1", "a"), L("ns1", "b"),
                            L("ns1", "c"), DL("ns1", "b"), L("ns1", "d")],
            what="allocation continues after lastAllocated, not at the lowest free address"))
    add(Seq("wrap-around", [P("g", "10.2.1.0/24", "10.2.1.10", "10.2.1.12"), L("ns1", "a"), L("ns1", "b"),
                            L("ns1", "c"), DL("ns1", "a"), L("ns1", "d")],
            what="the scan wraps to the first range"))
    add(Seq("gateway-skipped", [P("g", "10.2.2.0/24", "10.2.2.1", "10.2.2.4", gw="10.2.2.2"), L("ns1", "a"),
                                L("ns1", "b"), L("ns1", "c")],
            what="the gateway inside the range is never handed out"))
    add(Seq("multi-range", [P("g", ranges=[{"subnet": "10.2.3.0/24", "rangeStart": "10.2.3.10", "rangeEnd": "10.2.3.11"},
                                           {"subnet": "10.2.4.0/24", "rangeStart": "10.2.4.10", "rangeEnd": "10.2.4.11"}]),
                            L("ns1", "a"), L("ns1", "b"), L("ns1", "c")],
            what="allocation continues in the next range"))
    add(Seq("slash-32", [P("g", "10.2.5.7/32"), L("ns1", "a"), L("ns1", "b")],
            known={r"lb/ns1/b/aa$": "empty-allocated-address", r"lb/ns1/a/aa$": "slash-32-gateway"},
            what="a /32 pool has one address and no gateway"))
    add(Seq("ipv6", [P("g", "fd00:10::/120", "fd00:10::10", "fd00:10::12"), L("ns1", "a"), L("ns1", "b")],
            what="an IPv6 pool"))
    add(Seq("defaults-total", [P("g", "10.2.6.0/24"), L("ns1", "a")],
            what="default range and gateway: total 253, first address .2"))
    add(Seq("same-name-two-namespaces", [P("g", "10.2.7.0/24", "10.2.7.10", "10.2.7.20"), L("ns1", "a"), L("ns2", "a")],
            what="the id is namespace/name"))
    # --- exhaustion ---
    add(Seq("exhaustion", [P("g", "10.3.0.0/24", "10.3.0.10", "10.3.0.11"), L("ns1", "a"), L("ns1", "b"), L("ns1", "c")],
            known={r"lb/ns1/c/aa$": "empty-allocated-address",
                   r"pool/g/(allocatedHistory|lastAllocated)$": "exhaustion-wakeup"},
            what="a third load balancer on a two-address pool (then all three deleted at once)"))
    add(Seq("exhaustion-release", [P("g", "10.3.1.0/24", "10.3.1.10", "10.3.1.11"), L("ns1", "a"), L("ns1", "b"),
                                   L("ns1", "c"), DL("ns1", "a"), WAIT("ns1", "c")],
            known={r"lb/ns1/c/aa$": "empty-allocated-address", r"lb/ns1/c/ready$": "exhaustion-wakeup"},
            what="the waiting load balancer gets the released address"))
    add(Seq("exhaustion-grow", [P("g", "10.3.2.0/24", "10.3.2.10", "10.3.2.11"), L("ns1", "a"), L("ns1", "b"),
                                L("ns1", "c"), ("pool-ranges", "g", [{"subnet": "10.3.2.0/24", "rangeStart": "10.3.2.10",
                                                                      "rangeEnd": "10.3.2.12"}]), WAIT("ns1", "c")],
            known={r"lb/ns1/c/aa$": "empty-allocated-address", r"lb/ns1/c/ready$": "exhaustion-wakeup"},
            what="growing the range serves the waiting load balancer"))
    # --- history ---
    add(Seq("history-reuse", [P("g", "10.4.0.0/24", "10.4.0.10", "10.4.0.20"), L("ns1", "a"), DL("ns1", "a"),
                              L("ns1", "b"), L("ns1", "a")],
            what="a load balancer created again gets its old address back from history"))
    add(Seq("history-taken", [P("g", "10.4.1.0/24", "10.4.1.10", "10.4.1.11"), L("ns1", "a"), DL("ns1", "a"),
                              L("ns1", "b"), L("ns1", "c"), DL("ns1", "b"), L("ns1", "a")],
            what="a history address taken by another id is forgotten"))
    add(Seq("history-pruned-by-shrink", [P("g", "10.4.2.0/24", "10.4.2.10", "10.4.2.20"), L("ns1", "a"), DL("ns1", "a"),
                                         ("pool-ranges", "g", [{"subnet": "10.4.2.0/24", "rangeStart": "10.4.2.11",
                                                                "rangeEnd": "10.4.2.20"}]),
                                         L("ns1", "a")],
            what="a range change prunes history outside the ranges"))
    add(Seq("delete-into-history", [P("g", "10.4.3.0/24", "10.4.3.10", "10.4.3.20"), L("ns1", "a"), L("ns2", "b"),
                                    DL("ns1", "a"), DL("ns2", "b")],
            what="deleting releases into allocatedHistory"))
    # --- range changes ---
    add(Seq("shrink-below-allocated", [P("g", "10.5.0.0/24", "10.5.0.10", "10.5.0.20"), L("ns1", "a"), L("ns1", "b"),
                                       ("pool-ranges", "g", [{"subnet": "10.5.0.0/24", "rangeStart": "10.5.0.11",
                                                              "rangeEnd": "10.5.0.20"}]), L("ns1", "c")],
            known={r"pool/g/available$": "available-shrunk", r"pool/g/allocatedHistory$": "history-outside-ranges"},
            what="shrinking the range below an allocated address (no webhook to refuse it)"))
    add(Seq("grow-keeps", [P("g", "10.5.1.0/24", "10.5.1.10", "10.5.1.12"), L("ns1", "a"),
                           ("pool-ranges", "g", [{"subnet": "10.5.1.0/24", "rangeStart": "10.5.1.10", "rangeEnd": "10.5.1.30"}]),
                           L("ns1", "b")], what="growing keeps allocations and counts"))
    add(Seq("split-range", [P("g", "10.5.2.0/24", "10.5.2.10", "10.5.2.20"), L("ns1", "a"), L("ns1", "b"),
                            ("pool-ranges", "g", [{"subnet": "10.5.2.0/24", "rangeStart": "10.5.2.10", "rangeEnd": "10.5.2.10"},
                                                  {"subnet": "10.5.2.0/24", "rangeStart": "10.5.2.11", "rangeEnd": "10.5.2.20"}]),
                            L("ns1", "c")], what="splitting a range into two keeps allocations"))
    # --- deletes ---
    add(Seq("pool-delete-empty", [P("g", "10.6.0.0/24", "10.6.0.10", "10.6.0.20"), P("p1", "10.6.1.0/24", scope=[("*", "ns1", "*")]),
                                  DP("p1"), L("ns1", "a")],
            what="deleting an unused pool"))
    add(Seq("pool-delete-with-allocations", [P("p1", "10.6.2.0/24", "10.6.2.10", "10.6.2.20", scope=[("*", "ns1", "*")]),
                                             L("ns1", "a"), DP("p1"), DL("ns1", "a")],
            known={r"pool/p1/": "pool-delete-with-allocations", r"lb/ns1/a/": "pool-delete-with-allocations",
                   r"(svc|eps)/ns1/a$": "pool-delete-with-allocations"},
            what="deleting a pool that still has an allocation (no webhook to refuse it), then the load balancer"))
    add(Seq("change-explicit-pool", [P("a1", "10.6.3.0/24", "10.6.3.10", "10.6.3.20", scope=[("*", "ns1", "*")]),
                                     P("b1", "10.6.4.0/24", "10.6.4.10", "10.6.4.20", scope=[("*", "ns2", "*")]),
                                     L("ns1", "x", pool="a1"), ("lb-patch", "ns1", "x", {"spec": {"ipPool": "b1"}})],
            known={r"lb/ns1/x/address$": "address-follows-service"},
            what="changing spec.ipPool releases to the old pool and allocates from the new"))
    add(Seq("empty-ipam", [P("g", "10.6.5.0/24", "10.6.5.10", "10.6.5.20"), L("ns1", "a", ipam=None), DL("ns1", "a")],
            known={r"pool/g/(available|allocated|allocatedHistory)": "empty-ipam-leak"},
            what="an LB without spec.ipam is allocated from a pool; deleting it"))
    add(Seq("manual-release-existing", [P("g", "10.6.6.0/24", "10.6.6.10", "10.6.6.20"), L("ns1", "a"),
                                        ("pool-annotate", "g", {"loadbalancer.harvesterhci.io/manuallyReleaseIP": "10.6.6.10: ns1/a"})],
            what="manuallyReleaseIP for an address whose load balancer exists: kept, annotation removed"))
    add(Seq("manual-release-invalid", [P("g", "10.6.7.0/24", "10.6.7.10", "10.6.7.20"),
                                       ("pool-annotate", "g", {"loadbalancer.harvesterhci.io/manuallyReleaseIP": "garbage"})],
            what="a malformed manuallyReleaseIP is removed"))
    # --- DHCP ---
    add(Seq("dhcp-vm", [P("g", "10.7.0.0/24", "10.7.0.10", "10.7.0.20"), L("ns1", "a", ipam="dhcp")],
            what="a DHCP VM load balancer: 0.0.0.0, its Service asks kube-vip for a lease"))
    add(Seq("dhcp-cluster", [L("gc-ns", "a", wt="cluster", ipam="dhcp", cluster="gc1")],
            what="a DHCP guest load balancer needs no pool"))
    add(Seq("dhcp-and-pool", [P("g", "10.7.1.0/24", "10.7.1.10", "10.7.1.20"), L("ns1", "a", ipam="dhcp"), L("ns1", "b"),
                              DL("ns1", "a")], what="DHCP takes nothing from the pool"))
    # --- ours, not upstream's (issue 27): annotations upstream's controller and webhook must ignore ---
    add(Seq("skip-addresses", [P("sk", "10.0.0.0/16", "10.0.0.254", "10.0.1.1",
                                 ann={"loadbalancer.harvesterhci.io/skipAddresses": "dot0And255"}),
                               L("ns1", "a"), L("ns1", "b")],
            known={r"lb/ns1/b/(aa|address)$": "skip-addresses", r"svc/ns1/b$": "skip-addresses", r"pool/sk/(allocated|lastAllocated|allocatedHistory)$": "skip-addresses"},
            what="a pool that skips .0 and .255: upstream hands out 10.0.0.255 next, ours 10.0.1.1"))
    add(Seq("skip-addresses-added-later", [P("g", "10.7.2.0/24", "10.7.2.10", "10.7.2.20"), L("ns1", "a"),
                                           ("pool-annotate", "g", {"loadbalancer.harvesterhci.io/skipAddresses": "dot0And255,firstLast"}),
                                           L("ns1", "b"), DL("ns1", "a")],
            what="the annotation added to a pool in use moves nothing; addresses it does not skip are handed out alike"))
    add(Seq("service-selector", [P("gold", "10.7.3.0/24", "10.7.3.10", "10.7.3.20", scope=[("*", "ns1", "*")], priority=10,
                                   ann={"loadbalancer.harvesterhci.io/serviceSelector": "tier=gold"}),
                                 P("g", "10.7.4.0/24", "10.7.4.10", "10.7.4.20"),
                                 L("ns1", "a", ann={"cloudprovider.harvesterhci.io/serviceLabels": '{"tier":"silver"}'}),
                                 L("ns1", "b", ann={"cloudprovider.harvesterhci.io/serviceLabels": '{"tier":"gold"}'})],
            known={r"lb/ns1/(a|b)/(aa|address)$": "service-selector", r"svc/ns1/(a|b)$": "service-selector", r"pool/(gold|g)/(available|lastAllocated|allocated|allocatedHistory)$": "service-selector"},
            what="a pool for tier=gold beside the global pool: upstream gives both from the gold pool (priority 10)"))
    add(Seq("service-selector-own-labels", [P("gold", "10.7.5.0/24", "10.7.5.10", "10.7.5.20", scope=[("*", "ns1", "*")],
                                              ann={"loadbalancer.harvesterhci.io/serviceSelector": "tier in (gold,platinum),!canary"}),
                                            L("ns1", "a", labels={"tier": "gold"})],
            what="a load balancer made on Harvester is matched on its own labels; one that matches is served alike"))
    add(Seq("sharing-key", [P("g", "10.7.6.0/24", "10.7.6.10", "10.7.6.20"),
                            L("ns1", "a", ann={"loadbalancer.harvesterhci.io/sharing-key": "k1"}),
                            L("ns1", "b", ann={"metallb.io/allow-shared-ip": "k1"},
                              listeners=[{"name": "dns", "port": 53, "protocol": "UDP", "backendPort": 5353}]),
                            L("ns1", "c")],
            known={r"lb/ns1/(b|c)/(aa|address|ready)$": "sharing-key", r"svc/ns1/(b|c)$": "sharing-key",
                   r"pool/g/(available|lastAllocated|allocated|allocatedHistory)$": "sharing-key"},
            what="two load balancers with one key (ours and MetalLB's alias) share 10.7.6.10; upstream gives b its own"))
    add(Seq("dhcp-record", [L("gc-ns", "a", wt="cluster", ipam="dhcp", cluster="gc1", ann={
                "cloudprovider.harvesterhci.io/dhcpMACAddress": "02:00:5e:10:00:01",
                "cloudprovider.harvesterhci.io/dhcpLeasedIP": "192.168.77.7",
                "cloudprovider.harvesterhci.io/dhcpHostname": "web-lb"})],
            what="a DHCP guest load balancer carrying our lease record: 0.0.0.0 on both sides"))
    # --- VM load balancers with VMIs ---
    add(Seq("vm-no-backends", [P("g", "10.8.0.0/24", "10.8.0.10", "10.8.0.20"), L("ns1", "a", selector={"app": ["web"]})],
            what="no VMI matches: no running backend servers, dummy endpoint"))
    add(Seq("vm-backend", [P("g", "10.8.1.0/24", "10.8.1.10", "10.8.1.20"), VMI("ns1", "vm1", {"app": "web"}, "10.52.1.11"),
                           L("ns1", "a", selector={"app": ["web"]})],
            what="a running VMI with an address is the backend"))
    add(Seq("vm-backend-no-ip", [P("g", "10.8.2.0/24", "10.8.2.10", "10.8.2.20"), VMI("ns1", "vm1", {"app": "web"}, None),
                                 L("ns1", "a", selector={"app": ["web"]})],
            what="a matching VMI without an address"))
    add(Seq("vm-backend-later", [P("g", "10.8.3.0/24", "10.8.3.10", "10.8.3.20"), L("ns1", "a", selector={"app": ["web"]}),
                                 VMI("ns1", "vm1", {"app": "web"}, "10.52.3.11")],
            what="a VMI that appears later becomes the backend"))
    add(Seq("vm-backend-removed", [P("g", "10.8.4.0/24", "10.8.4.10", "10.8.4.20"), VMI("ns1", "vm1", {"app": "web"}, "10.52.4.11"),
                                   L("ns1", "a", selector={"app": ["web"]}), ("vmi-delete", "ns1", "vm1")],
            what="the only backend VMI goes"))
    add(Seq("vm-selector-and", [P("g", "10.8.5.0/24", "10.8.5.10", "10.8.5.20"),
                                VMI("ns1", "vm1", {"app": "web", "tier": "front"}, "10.52.5.11"),
                                VMI("ns1", "vm2", {"app": "web"}, "10.52.5.12"),
                                L("ns1", "a", selector={"app": ["web"], "tier": ["front"]})],
            what="selector keys are ANDed"))
    add(Seq("vm-selector-in", [P("g", "10.8.6.0/24", "10.8.6.10", "10.8.6.20"),
                               VMI("ns1", "vm1", {"app": "web"}, "10.52.6.11"), VMI("ns1", "vm2", {"app": "api"}, "10.52.6.12"),
                               VMI("ns2", "vm3", {"app": "web"}, "10.52.6.13"),
                               L("ns1", "a", selector={"app": ["web", "api"]})],
            what="a key's values are an In requirement; VMIs of other namespaces never count"))
    add(Seq("vm-health-check", [P("g", "10.8.7.0/24", "10.8.7.10", "10.8.7.20"), VMI("ns1", "vm1", {"app": "web"}, "192.0.2.11"),
                                L("ns1", "a", selector={"app": ["web"]}, hc=8080)],
            what="a health check on an unreachable backend"))
    add(Seq("vm-listeners", [P("g", "10.8.8.0/24", "10.8.8.10", "10.8.8.20"),
                             L("ns1", "a", listeners=[{"name": "http", "port": 80, "protocol": "TCP", "backendPort": 8080},
                                                      {"name": "dns", "port": 53, "protocol": "UDP", "backendPort": 5353}])],
            what="one Service port per listener"))
    add(Seq("vm-label-change", [P("g", "10.8.9.0/24", "10.8.9.10", "10.8.9.20"), VMI("ns1", "vm1", {"app": "web"}, "10.52.9.11"),
                                L("ns1", "a", selector={"app": ["web"]}), ("vmi-labels", "ns1", "vm1", {"app": "other"})],
            known={r"lb/ns1/a/(backendServers|ready)$": "vmi-label-change", r"eps/ns1/a$": "vmi-label-change"},
            what="the backend VMI stops matching"))
    # --- many at once ---
    add(Seq("burst", [P("g", "10.9.0.0/24", "10.9.0.10", "10.9.0.40")] + [("lb-nowait", lb_obj("ns1", f"b{i:02d}")) for i in range(12)]
            + [("settle",)], compare="addresses-as-set",
            what="12 load balancers created at once: the same set of addresses (which gets which is order)"))
    return s


# --- running ----------------------------------------------------------------------------------

def apply_step(k, step):
    kind = step[0]
    if kind == "pool":
        k.create(k.pool_path(), step[1])
    elif kind in ("lb", "lb-nowait"):
        obj = step[1]
        k.create(k.lb_path(obj["metadata"]["namespace"]), obj)
    elif kind == "lb-delete":
        k.delete(k.lb_path(step[1], step[2]))
    elif kind == "lb-patch":
        k.merge(k.lb_path(step[1], step[2]), step[3])
    elif kind == "pool-delete":
        k.delete(k.pool_path(step[1]))
    elif kind == "pool-ranges":
        k.merge(k.pool_path(step[1]), {"spec": {"ranges": step[2]}})
    elif kind == "pool-annotate":
        k.merge(k.pool_path(step[1]), {"metadata": {"annotations": step[2]}})
    elif kind == "nad":
        _, ns, name, vlan = step
        k.create(f"/apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions",
                 nad_obj(k, ns, name, vlan))
    elif kind == "vmi":
        _, ns, name, labels, ip, phase = step
        # KubeVirt's VMI CRD has no status subresource: virt-handler writes status with the object,
        # so the VMI is created as it stands once running (built from kubevirt.io/api's types).
        args = ["vmi", "-namespace", ns, "-name", name, "-phase", phase,
                "-interface", f"default:{ip}@enp1s0" if ip else "default@enp1s0"]
        for key, value in labels.items():
            args += ["-label", f"{key}={value}"]
        k.create(f"/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances", foreign(k, *args))
    elif kind == "vmi-delete":
        k.delete(f"/apis/kubevirt.io/v1/namespaces/{step[1]}/virtualmachineinstances/{step[2]}")
    elif kind == "vmi-labels":
        k.merge(f"/apis/kubevirt.io/v1/namespaces/{step[1]}/virtualmachineinstances/{step[2]}",
                {"metadata": {"labels": step[3]}})
    elif kind in ("wait-address", "settle"):
        pass
    else:
        raise ValueError(f"unknown step {kind}")


def step_label(step):
    kind = step[0]
    if kind in ("pool", "lb", "lb-nowait"):
        m = step[1]["metadata"]
        return f"{kind} {m.get('namespace', '') + '/' if m.get('namespace') else ''}{m['name']}"
    return f"{kind} " + " ".join(str(x) if not isinstance(x, (dict, list)) else json.dumps(x) for x in step[1:])


def ready_of(obj):
    for c in obj.get("status", {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return f"{c.get('status')}: {c.get('message', '')}"
    return None


def snapshot(k):
    out = {}
    for p in k.items(k.pool_path()):
        name = p["metadata"]["name"]
        if name == "interop-probe":
            continue
        st = p.get("status", {})
        base = f"pool/{name}/"
        for key in ("total", "available", "lastAllocated"):
            out[base + key] = st.get(key)
        out[base + "allocated"] = dict(sorted((st.get("allocated") or {}).items()))
        out[base + "allocatedHistory"] = dict(sorted((st.get("allocatedHistory") or {}).items()))
        out[base + "ready"] = ready_of(p)
        out[base + "deleting"] = bool(p["metadata"].get("deletionTimestamp"))
    for lb in k.items(k.lb_path()):
        m = lb["metadata"]
        st = lb.get("status", {})
        base = f"lb/{m['namespace']}/{m['name']}/"
        out[base + "aa"] = st["allocatedAddress"] if "allocatedAddress" in st else "<absent>"
        out[base + "workloadType"] = lb.get("spec", {}).get("workloadType") or "vm"
        out[base + "address"] = st.get("address", "")
        out[base + "backendServers"] = sorted(st.get("backendServers") or [])
        out[base + "ready"] = ready_of(lb)
        out[base + "deleting"] = bool(m.get("deletionTimestamp"))
    for svc in k.items("/api/v1/services", "loadbalancer.harvesterhci.io/servicelb=true"):
        m = svc["metadata"]
        out[f"svc/{m['namespace']}/{m['name']}"] = {
            "loadBalancerIP": svc["spec"].get("loadBalancerIP"),
            "ports": sorted((p.get("name"), p.get("protocol"), p.get("port"), p.get("targetPort")) for p in svc["spec"].get("ports", [])),
        }
    for eps in k.items("/apis/discovery.k8s.io/v1/endpointslices", "loadbalancer.harvesterhci.io/servicelb=true"):
        m = eps["metadata"]
        out[f"eps/{m['namespace']}/{m['name']}"] = sorted(
            (",".join(e.get("addresses", [])), bool(e.get("conditions", {}).get("ready"))) for e in eps.get("endpoints") or [])
    return json.loads(json.dumps(out))


def events(k):
    out = set()
    for ns in NAMESPACES:
        for e in k.items(f"/api/v1/namespaces/{ns}/events"):
            io = e.get("involvedObject", {})
            if io.get("kind") in ("LoadBalancer", "IPPool"):
                out.add(f"{io.get('kind')} {io.get('namespace', '')}/{io.get('name')}: {e.get('type')} {e.get('reason')}")
    return out


def settle(k, wait_for=None, quiet=1.5, limit=25.0):
    """Polls the state until it has not changed for `quiet` s (and, with `wait_for`, that LB has an
    address, up to 60 s)."""
    deadline = time.monotonic() + (60.0 if wait_for else limit)
    prev, since = None, time.monotonic()
    while True:
        cur = snapshot(k)
        now = time.monotonic()
        if cur != prev:
            prev, since = cur, now
        waiting = False
        if wait_for:
            aa = cur.get(f"lb/{wait_for[0]}/{wait_for[1]}/aa")
            waiting = not (isinstance(aa, dict) and aa.get("ip"))
        if (now - since >= quiet and not waiting) or now > deadline:
            return cur
        time.sleep(0.25)


def both(fn, up, ours):
    out = [None, None]
    err = [None, None]

    def run(i, k):
        try:
            out[i] = fn(k)
        except Exception as e:  # noqa: BLE001 - carried to the caller
            err[i] = e
    ts = [threading.Thread(target=run, args=(i, k)) for i, k in enumerate((up, ours))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out, err


def cleanup(k):
    """Deletes every load balancer, VMI, NAD and pool; removes finalizers nobody removes within
    20 s and says so."""
    forced = []
    for lb in k.items(k.lb_path()):
        m = lb["metadata"]
        k.delete(k.lb_path(m["namespace"], m["name"]))
    for ns in NAMESPACES:
        k.req("DELETE", f"/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances", ok404=True)
        k.req("DELETE", f"/apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions", ok404=True)
    deadline = time.monotonic() + 20
    while k.items(k.lb_path()) and time.monotonic() < deadline:
        time.sleep(0.25)
    for lb in k.items(k.lb_path()):
        m = lb["metadata"]
        forced.append(f"lb {m['namespace']}/{m['name']}")
        k.merge(k.lb_path(m["namespace"], m["name"]), {"metadata": {"finalizers": None}})
    for p in k.items(k.pool_path()):
        k.delete(k.pool_path(p["metadata"]["name"]))
    deadline = time.monotonic() + 20
    while k.items(k.pool_path()) and time.monotonic() < deadline:
        time.sleep(0.25)
    for p in k.items(k.pool_path()):
        forced.append(f"pool {p['metadata']['name']}")
        k.merge(k.pool_path(p["metadata"]["name"]), {"metadata": {"finalizers": None}})
    for svc in k.items("/api/v1/services", "loadbalancer.harvesterhci.io/servicelb=true"):
        m = svc["metadata"]
        k.delete(f"/api/v1/namespaces/{m['namespace']}/services/{m['name']}")
    for ns in NAMESPACES:
        k.req("DELETE", f"/api/v1/namespaces/{ns}/events", ok404=True)
        k.req("DELETE", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector="
                        "loadbalancer.harvesterhci.io%2Fservicelb%3Dtrue", ok404=True)
    return forced


def normalize(seq, snap):
    if seq.compare != "addresses-as-set":
        return snap
    out = {}
    addrs = []
    for key, v in snap.items():
        if key.startswith("lb/") and key.endswith("/aa"):
            addrs.append(v.get("ip") if isinstance(v, dict) else v)
        elif key.startswith("pool/") and key.endswith(("/allocated", "/allocatedHistory")):
            out[key] = [sorted(v), sorted(v.values())]
        elif key.startswith("pool/") and key.endswith("/lastAllocated"):
            continue
        elif key.startswith("svc/"):
            out["svc/*"] = sorted(out.get("svc/*", []) + [v["loadBalancerIP"]])
        elif key.startswith("lb/") and key.endswith(("/ready", "/deleting", "/backendServers")):
            out["lb/*/" + key.rsplit("/", 1)[1]] = sorted(out.get("lb/*/" + key.rsplit("/", 1)[1], []) + [json.dumps(v)])
        elif key.startswith("lb/") and key.endswith("/address"):
            out["lb/*/address"] = sorted(out.get("lb/*/address", []) + [v])
        elif key.startswith("eps/"):
            out["eps/*"] = sorted(out.get("eps/*", []) + [json.dumps(v)])
        else:
            out[key] = v
    out["lb/*/aa"] = sorted(addrs, key=str)
    return out


def diff(seq, up, ours):
    unknown, known = [], set()
    for key in sorted(set(up) | set(ours)):
        a, b = up.get(key, "<missing>"), ours.get(key, "<missing>")
        if a == b:
            continue
        kid = None
        if key.endswith("/aa") and a == {} and b == "<absent>":
            kid = "empty-allocated-address"
        elif key.startswith(("svc/", "eps/")) and b == "<missing>" and f"lb/{key.split('/', 1)[1]}/aa" not in up:
            kid = "service-gc"
        elif (key.startswith("lb/") and key.endswith("/address") and a == "" and up.get(key[:-7] + "workloadType") == "cluster"
              and isinstance(ours.get(key[:-7] + "aa"), dict) and b == ours[key[:-7] + "aa"].get("ip")):
            kid = "cluster-address"
        for pat, k in seq.known.items():
            if kid is None and re.search(pat, key):
                kid = k
        if kid:
            known.add(kid)
        else:
            unknown.append(f"{key}: upstream {json.dumps(a)} / ours {json.dumps(b)}")
    return unknown, known


def run(up, ours, only, say, on_result=None):
    seqs = [s for s in sequences() if not only or s.name in only]
    report = {"sequences": [], "known": KNOWN}
    for i, seq in enumerate(seqs):
        t = time.monotonic()
        say(f"c [{i + 1}/{len(seqs)}] {seq.name}: {seq.what}")
        entry = {"name": seq.name, "what": seq.what, "steps": [], "unknown": [], "known": set(), "forced": {}}
        try:
            for n, step in enumerate(seq.steps + [("teardown",)]):
                if step[0] == "teardown":
                    def teardown(k):
                        for lb in k.items(k.lb_path()):
                            m = lb["metadata"]
                            k.delete(k.lb_path(m["namespace"], m["name"]))
                    _, err = both(teardown, up, ours)
                    label = "delete every LoadBalancer"
                else:
                    _, err = both(lambda k: apply_step(k, step), up, ours)
                    label = step_label(step)
                if err[0] or err[1]:
                    if str(err[0]) != str(err[1]):
                        entry["unknown"].append(f"step {n} {label}: the API answered upstream {err[0]} / ours {err[1]}")
                if step[0] == "lb-nowait":
                    continue
                wait_for = step[1:3] if step[0] == "wait-address" else None
                if step[0] == "pool" and len(step) > 2:
                    wait_for = step[2]  # a pool that a waiting load balancer should now get
                (su, so), errs = both(lambda k: settle(k, wait_for), up, ours)
                if errs[0] or errs[1]:
                    raise RuntimeError(f"snapshot failed: {errs}")
                unknown, known = diff(seq, normalize(seq, su), normalize(seq, so))
                entry["unknown"] += [f"step {n} ({label}): {u}" for u in unknown]
                entry["known"] |= known
                entry["steps"].append({"step": label, "upstream": su, "ours": so})
            (eu, eo), _ = both(events, up, ours)
            if eu:
                entry["unknown"].append(f"upstream wrote Events: {sorted(eu)[:5]}")
            if eo:
                entry["known"].add("events")
            entry["events_ours"] = sorted(eo)
        except Exception as e:  # noqa: BLE001 - the sequence fails with the reason
            entry["unknown"].append(f"harness: {type(e).__name__}: {e}")
        (fu, fo), _ = both(cleanup, up, ours)
        entry["forced"] = {"upstream": fu or [], "ours": fo or []}
        if (fu or []) != (fo or []) and "pool-delete-with-allocations" not in entry["known"]:
            entry["unknown"].append(f"finalizers left behind: upstream {fu} / ours {fo}")
        entry["known"] = sorted(entry["known"])
        entry["ok"] = not entry["unknown"]
        entry["secs"] = round(time.monotonic() - t, 1)
        report["sequences"].append(entry)
        if on_result:
            on_result(entry)
    return report
