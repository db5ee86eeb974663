"""What the interop harness needs of a Kubernetes control plane: a small REST client on the
standard library (the admin's client certificate from scripts/control-plane.sh, or a bearer token),
processes it starts and stops by their own pid, the command lines of the peers (peers.json, which
the Kubernetes benches read too), and the seed of a Harvester-like cluster.

Run as a script, it lends two pieces to the benches (benches/support/peers.rs):
  kube.py seed-guest CPDIR             the guest cluster's seed (seed_guest)
  kube.py kube-vip CPDIR guest|harvester
                                       the kube-vip stand-in (KubeVip) until SIGTERM"""

import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

LB_GROUP = "loadbalancer.harvesterhci.io"
LB_API = f"/apis/{LB_GROUP}/v1beta1"


class ApiError(Exception):
    def __init__(self, code, body):
        super().__init__(f"HTTP {code}: {body[:300]}")
        self.code = code
        self.body = body


class Kube:
    """One control plane: `DIR/env` and `DIR/pki` as scripts/control-plane.sh writes them."""

    def __init__(self, cpdir, name):
        self.dir = cpdir
        self.name = name
        env = {}
        with open(os.path.join(cpdir, "env")) as f:
            for line in f:
                k, _, v = line.strip().partition("=")
                env[k] = v
        self.server = env["KUBE_APISERVER"]
        self.kubeconfig = env["KUBECONFIG_ADMIN"]
        pki = os.path.join(cpdir, "pki")
        self.ca = os.path.join(pki, "ca.crt")
        self.ctx = ssl.create_default_context(cafile=self.ca)
        self.ctx.load_cert_chain(os.path.join(pki, "admin.crt"), os.path.join(pki, "admin.key"))

    def req(self, method, path, body=None, ctype="application/json", ok404=False):
        data = None if body is None else json.dumps(body).encode()
        r = urllib.request.Request(self.server + path, data=data, method=method)
        r.add_header("Accept", "application/json")
        if data is not None:
            r.add_header("Content-Type", ctype)
        try:
            with urllib.request.urlopen(r, context=self.ctx, timeout=30) as resp:
                raw = resp.read()
                return json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            if ok404 and e.code == 404:
                return None
            raise ApiError(e.code, text) from None

    def get(self, path):
        return self.req("GET", path, ok404=True)

    def items(self, path, selector=None):
        if selector:
            path += "?labelSelector=" + urllib.parse.quote(selector)
        out = self.req("GET", path, ok404=True)
        return [] if out is None else out.get("items", [])

    def create(self, path, obj):
        return self.req("POST", path, obj)

    def put(self, path, obj):
        return self.req("PUT", path, obj)

    def merge(self, path, patch):
        return self.req("PATCH", path, patch, ctype="application/merge-patch+json")

    def delete(self, path):
        try:
            return self.req("DELETE", path)
        except ApiError as e:
            if e.code == 404:
                return None
            raise

    def apply(self, path, obj, manager="interop"):
        """Server-side apply (forced) of `obj` at `path` (the object's own URL)."""
        q = f"?fieldManager={manager}&force=true"
        return self.req("PATCH", path + q, obj, ctype="application/apply-patch+yaml")

    # The two kinds of this harness.
    @staticmethod
    def pool_path(name=""):
        return f"{LB_API}/ippools" + (f"/{name}" if name else "")

    @staticmethod
    def lb_path(ns=None, name=""):
        if ns is None:
            return f"{LB_API}/loadbalancers"
        return f"{LB_API}/namespaces/{ns}/loadbalancers" + (f"/{name}" if name else "")

    def kubeconfig_for_token(self, token, path, namespace=None):
        ctx = {"cluster": "cp", "user": "u"}
        if namespace:
            ctx["namespace"] = namespace
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cp", "cluster": {"server": self.server, "certificate-authority": self.ca}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "cp", "context": ctx}],
            "current-context": "cp",
        }
        with open(path, "w") as f:
            json.dump(cfg, f)
        os.chmod(path, 0o600)
        return path

    def sa_token(self, ns, sa, seconds=86400):
        out = self.create(
            f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}},
        )
        return out["status"]["token"]


def eventually(what, probe, timeout=60.0, every=0.25):
    """Calls probe() until it returns something truthy; raises with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            v = probe()
            if v:
                return v
        except ApiError as e:
            last = e
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s" + (f" (last error {last})" if last else ""))


class Proc:
    """A process this harness started (its own session); stopped by its pid only."""

    def __init__(self, name, argv, logdir, env=None):
        self.name = name
        self.log = os.path.join(logdir, f"{name}.log")
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.f = open(self.log, "ab")
        self.p = subprocess.Popen(argv, stdout=self.f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=full_env, start_new_session=True)

    def alive(self):
        return self.p.poll() is None

    def tail(self, n=15):
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self, grace=15):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(grace)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.f.close()


PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers.json")


def peer(name, **values):
    """The argv and environment of the peer `name` of peers.json, its `{key}`s filled from `values`."""
    with open(PEERS) as f:
        spec = json.load(f)[name]
    argv = [a.format(**values) for a in spec["argv"]]
    env = {k: v.format(**values) for k, v in spec["env"].items()}
    return argv, env


def foreign(k, *args):
    """An object of a kind we read but do not own, as its upstream's Go types make it: the control
    plane's `foreign/bin/foreign-crds` (tools/foreign-crds) prints it, e.g. `("vmi", "-name", "a")`."""
    tool = os.path.join(k.dir, "foreign", "bin", "foreign-crds")
    out = subprocess.run([tool, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"foreign-crds {' '.join(args)} failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def foreign_crds(k):
    """KubeVirt's VM, VMI and migration CRDs as virt-operator generates them, and Multus's
    NetworkAttachmentDefinition CRD, as `scripts/control-plane.sh up` copied them into `DIR/foreign`."""
    d = os.path.join(k.dir, "foreign", "crds")
    crds = []
    for f in sorted(os.listdir(d)):
        if f.endswith(".json"):
            with open(os.path.join(d, f)) as fh:
                crds.append(json.load(fh))
    names = {c["metadata"]["name"] for c in crds}
    for want in ("virtualmachineinstances.kubevirt.io", "virtualmachines.kubevirt.io",
                 "network-attachment-definitions.k8s.cni.cncf.io"):
        if want not in names:
            raise RuntimeError(f"{d} lacks the CRD {want}: is the control plane's foreign/ complete?")
    return crds


NAMESPACES = ["default", "harvester-system", "ns1", "ns2", "ns3", "gc-ns"]


def load_yaml_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def seed_harvester(k, lb_crd_dir, manifest):
    """A Harvester-like cluster: namespaces, KubeVirt's and Multus's CRDs as their upstreams define
    them (`foreign_crds`: validating schemas, and no status subresource on VMIs), the LoadBalancer and IPPool CRDs of
    `lb_crd_dir`, Harvester's `harvesterhci.io:cloudprovider` ClusterRole, and the ServiceAccount and
    RBAC of this service's manifest (the service runs with exactly those)."""
    for ns in NAMESPACES:
        k.apply(f"/api/v1/namespaces/{ns}", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    crds = foreign_crds(k)
    for f in sorted(os.listdir(lb_crd_dir)):
        if f.endswith(".yaml"):
            crds += load_yaml_docs(os.path.join(lb_crd_dir, f))
    for crd in crds:
        k.apply(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}", crd)
    for crd in crds:
        name = crd["metadata"]["name"]
        eventually(f"CRD {name} established", lambda: any(
            c["type"] == "Established" and c["status"] == "True"
            for c in (k.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {})
            .get("status", {}).get("conditions", [])))
    # Harvester's chart's role for cloud-configs (what this service's `kubeconfig generate` binds).
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "harvesterhci.io:cloudprovider"},
        "rules": [
            {"apiGroups": [LB_GROUP], "resources": ["loadbalancers"], "verbs": ["*"]},
            {"apiGroups": ["kubevirt.io"], "resources": ["virtualmachines", "virtualmachineinstances"],
             "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["subresources.kubevirt.io"],
             "resources": ["virtualmachines/addvolume", "virtualmachines/removevolume",
                           "virtualmachineinstances/guestosinfo"], "verbs": ["update"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["*"]},
        ],
    }
    k.apply("/apis/rbac.authorization.k8s.io/v1/clusterroles/harvesterhci.io:cloudprovider", role)
    plural = {"ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles",
              "ClusterRoleBinding": "clusterrolebindings", "Role": "roles", "RoleBinding": "rolebindings"}
    n = 0
    for obj in load_yaml_docs(manifest):
        kind = obj.get("kind")
        if kind not in plural:
            continue
        meta = obj["metadata"]
        if kind in ("ServiceAccount", "Role", "RoleBinding"):
            group = "/api/v1" if kind == "ServiceAccount" else "/apis/rbac.authorization.k8s.io/v1"
            path = f"{group}/namespaces/{meta['namespace']}/{plural[kind]}/{meta['name']}"
        else:
            path = f"/apis/rbac.authorization.k8s.io/v1/{plural[kind]}/{meta['name']}"
        k.apply(path, obj)
        n += 1
    if n != 5:
        raise RuntimeError(f"{manifest}: expected the ServiceAccount and 4 RBAC objects, found {n}")


def seed_guest(k):
    for ns in ["default", "kube-system", "gns"]:
        k.apply(f"/api/v1/namespaces/{ns}", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    # One node, as a guest cluster has (the service controller hands nodes to the cloud provider).
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1", "labels": {"kubernetes.io/hostname": "node-1"}}}
    k.apply("/api/v1/nodes/node-1", node)
    k.req("PATCH", "/api/v1/nodes/node-1/status?fieldManager=interop&force=true", {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "message": "stand-in", "lastTransitionTime": "2026-12-01T00:00:00Z"}],
                   "addresses": [{"type": "InternalIP", "address": "10.0.0.11"}]}},
        ctype="application/apply-patch+yaml")


def dhcp_lease(ns, name):
    """The address a DHCP server would lease to `ns/name`: stable, so both sides of a comparison
    see the same one."""
    h = 0
    for ch in f"{ns}/{name}":
        h = (h * 131 + ord(ch)) % 65000
    return f"172.31.{h // 250}.{h % 250 + 2}"


class KubeVip(threading.Thread):
    """A stand-in for kube-vip: it writes a Service's `status.loadBalancer.ingress` from the address
    it was asked to announce (`kube-vip.io/loadbalancerIPs` in a guest cluster; `spec.loadBalancerIP`
    of a VM load balancer's Service on Harvester), leasing a DHCP address for `0.0.0.0`, and in a
    guest cluster the `kube-vip.io/vipHost` annotation, as kube-vip does."""

    def __init__(self, k, harvester_side):
        super().__init__(daemon=True)
        self.k = k
        self.harvester_side = harvester_side
        self.stopped = threading.Event()
        self.errors = 0

    def want(self, svc):
        if svc.get("spec", {}).get("type") != "LoadBalancer":
            return None
        if self.harvester_side:
            ips = svc["spec"].get("loadBalancerIP", "")
        else:
            ips = (svc["metadata"].get("annotations") or {}).get("kube-vip.io/loadbalancerIPs", "")
        if not ips:
            return None
        out = []
        for ip in ips.split(","):
            ip = ip.strip()
            if ip == "0.0.0.0":
                ip = dhcp_lease(svc["metadata"]["namespace"], svc["metadata"]["name"])
            out.append({"ip": ip})
        return out

    def run(self):
        sel = "loadbalancer.harvesterhci.io/servicelb=true" if self.harvester_side else None
        while not self.stopped.is_set():
            try:
                for svc in self.k.items("/api/v1/services", sel):
                    want = self.want(svc)
                    have = svc.get("status", {}).get("loadBalancer", {}).get("ingress")
                    if want is None or [{"ip": i.get("ip")} for i in (have or [])] == want:
                        continue
                    m = svc["metadata"]
                    path = f"/api/v1/namespaces/{m['namespace']}/services/{m['name']}"
                    self.k.merge(path + "/status", {"status": {"loadBalancer": {"ingress": want}}})
                    if not self.harvester_side:
                        # kube-vip records the node holding the address (kube-vip.io/vipHost); that
                        # change is what makes the guest's service controller sync the Service again
                        # and a cloud provider see the ingress it just got.
                        self.k.merge(path, {"metadata": {"annotations": {"kube-vip.io/vipHost": "node-1"}}})
            except Exception:  # noqa: BLE001 - a stand-in retries; the checks judge the outcome
                self.errors += 1
            self.stopped.wait(0.3)

    def stop(self):
        self.stopped.set()


def main(argv):
    if len(argv) == 2 and argv[0] == "seed-guest":
        seed_guest(Kube(argv[1], "guest"))
        return 0
    if len(argv) == 3 and argv[0] == "kube-vip" and argv[2] in ("guest", "harvester"):
        vip = KubeVip(Kube(argv[1], argv[2]), harvester_side=argv[2] == "harvester")
        signal.signal(signal.SIGTERM, lambda *_: vip.stop())
        vip.run()
        print(f"kube-vip stand-in: {vip.errors} failed rounds", flush=True)
        return 0
    print("usage: kube.py seed-guest CPDIR | kube-vip CPDIR guest|harvester", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
