#!/usr/bin/env python3
"""Checks the guest chart (deploy/guest-chart/harvester-cloud-provider), the stand-in for the
Harvester Cloud Provider chart, with the real helm; scripts/check-manifests.sh runs it and then
validates what it wrote (kubernetes-validate, and kube-apiserver's server-side dry run).

    check-guest-chart.py --helm HELM --out DIR [--bin HARVESTER_CLOUD] [--upstream CHARTS]

It renders the chart into DIR/guest-*.yaml with (a) its defaults, (b) exactly what a Rancher-
provisioned RKE2 cluster gives it (Rancher's HelmChartConfig, RKE2's --set-string globals), (c) a
value for every key of upstream's values.yaml at once, and (d) the HelmChart example's values, and
checks that:
- every key of upstream's values (the list in tests/guest_chart/upstream-keys.yaml, or read from
  upstream's chart with --upstream / HARVESTER_UPSTREAM_CHARTS: a harvester/charts checkout or git
  repository) is in our values.yaml and changes the rendering when set (a key accepted and ignored
  is a failure);
- the objects say what upstream's and Rancher's peers rely on: the cluster name where Harvester's
  CSI driver reads it, the cloud-config in both controllers, the service controller of Harvester's
  cloud provider off, kube-vip with what externalTrafficPolicy: Local needs (svc_election, the
  per-Service Leases and EndpointSlices), the registry on every image;
- bad values are refused with a message (a --controllers list that turns the service controller on,
  no cloud-config);
- harvester-cloud-ccm's RBAC is deploy/ccm/harvester-cloud-ccm.yaml's, which tests/guest_lb runs the
  ccm with;
- with --bin, `harvester-cloud` accepts the ccm arguments of every rendering (it gets past parsing,
  to reading the cloud-config);
- with --upstream, kube-vip's DaemonSet and RBAC and the cloud provider's Deployment are upstream's
  for the same values (upstream's chart rendered beside ours), but for the differences we mean; and
  upstream's chart is left in DIR/upstream-chart.
"""

import argparse
import copy
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy/guest-chart/harvester-cloud-provider"
FIXTURES = ROOT / "tests/guest_chart"
CCM_MANIFEST = ROOT / "deploy/ccm/harvester-cloud-ccm.yaml"
HELMCHART = ROOT / "deploy/guest-chart/helmchart.yaml"
UPSTREAM_CHART = "charts/harvester-cloud-provider"
RELEASE = "harvester-cloud-provider"
NAMESPACE = "kube-system"

failures = []


def fail(message):
    failures.append(message)
    print(f"FAIL: {message}", file=sys.stderr)


def merge(base, over):
    """Helm's coalescing of values: maps merge, a null deletes, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def nested(path, value):
    out = value
    for key in reversed(path):
        out = {key: out}
    return out


def get(tree, path):
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            raise KeyError(".".join(path))
        tree = tree[key]
    return tree


def leaves(tree, prefix=()):
    """Paths to the leaves of a values tree: a scalar, a list or an empty map ends a path."""
    if isinstance(tree, dict) and tree:
        for key, value in tree.items():
            yield from leaves(value, prefix + (key,))
    else:
        yield prefix


class Helm:
    def __init__(self, helm, scratch):
        self.helm = helm
        self.scratch = Path(scratch)
        self.count = 0

    def template(self, values=None, chart=CHART, sets=(), namespace=NAMESPACE, expect_ok=True):
        """Renders; returns (ok, stdout, stderr)."""
        self.count += 1
        args = [self.helm, "template", RELEASE, str(chart), "--namespace", namespace]
        if values is not None:
            path = self.scratch / f"values-{self.count}.yaml"
            path.write_text(yaml.safe_dump(values))
            args += ["--values", str(path)]
        for key, value in sets:
            args += ["--set-string", f"{key}={value}"]
        run = subprocess.run(args, capture_output=True, text=True)
        if expect_ok and run.returncode != 0:
            raise SystemExit(f"helm template failed ({values}):\n{run.stderr}")
        return run.returncode == 0, run.stdout, run.stderr

    def render(self, values=None, **kw):
        return self.template(values, **kw)[1]


def objects(text):
    return [d for d in yaml.safe_load_all(text) if d]


def find(docs, kind, name):
    found = [d for d in docs if d.get("kind") == kind and d["metadata"]["name"] == name]
    if len(found) != 1:
        raise SystemExit(f"expected one {kind} {name}, found {len(found)}")
    return found[0]


def container(workload, name):
    for c in workload["spec"]["template"]["spec"]["containers"]:
        if c["name"] == name:
            return c
    raise SystemExit(f"{workload['kind']} {workload['metadata']['name']} has no container {name}")


def env_of(c):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def images(docs):
    for d in docs:
        spec = d.get("spec", {}).get("template", {}).get("spec")
        if spec:
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                yield d["metadata"]["name"], c["image"]


# --- upstream's keys ------------------------------------------------------------------------------

def upstream_files(source):
    """(values.yaml, kube-vip's values.yaml, a directory with upstream's chart) of a harvester/charts
    checkout or git repository (bare or not), or None."""
    if not source:
        return None
    source = Path(source)
    chart_dir = Path(tempfile.mkdtemp(prefix="upstream-chart-"))
    if (source / UPSTREAM_CHART / "values.yaml").is_file():
        shutil.copytree(source / UPSTREAM_CHART, chart_dir / "harvester-cloud-provider")
    else:
        archive = subprocess.run(["git", "-C", str(source), "archive", "HEAD", UPSTREAM_CHART],
                                 capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(chart_dir)], input=archive.stdout, check=True)
        shutil.move(str(chart_dir / UPSTREAM_CHART), str(chart_dir / "harvester-cloud-provider"))
    chart = chart_dir / "harvester-cloud-provider"
    return (yaml.safe_load((chart / "values.yaml").read_text()),
            yaml.safe_load((chart / "dependency_charts/kube-vip/values.yaml").read_text()),
            chart)


def upstream_keys(upstream):
    values, kube_vip, _ = upstream
    merged = merge({"kube-vip": kube_vip}, values)
    return [tuple(p) for p in leaves(merged)]


# --- the checks -------------------------------------------------------------------------------------

def check_keys(h, table, keys, ours, out):
    """Every upstream key is in our values.yaml and changes the rendering; and the every-key file."""
    by_key = {tuple(entry["key"]): entry for entry in table}
    every = {}
    for key in keys:
        name = ".".join(key)
        entry = by_key.get(key)
        if entry is None:
            fail(f"upstream's values have {name}, which tests/guest_chart/upstream-keys.yaml lacks: "
                 f"add it with an example, and make the chart use it")
            continue
        try:
            get(ours, key)
        except KeyError:
            fail(f"upstream's key {name} is not in our values.yaml (documented there with its default)")
        context = entry.get("context", {})
        without = h.render(context)
        ok, with_key, err = h.template(merge(context, nested(key, entry["example"])), expect_ok=False)
        if not ok:
            fail(f"{name}: {entry['example']!r} is refused: {err.strip()}")
        elif with_key == without:
            fail(f"{name} is accepted but not used: setting it to {entry['example']!r} changes nothing")
        every = merge(every, nested(key, entry.get("every", entry["example"])))
    (out / "guest-every-key-values.yaml").write_text(yaml.safe_dump(every))
    return every


def check_rancher(h, out):
    """(b): Rancher's HelmChartConfig values and RKE2's --set-string globals, as helm-controller
    passes them (values file, then --set-string)."""
    config = yaml.safe_load((FIXTURES / "rancher-helmchartconfig.yaml").read_text())
    assert config["kind"] == "HelmChartConfig" and config["metadata"]["name"] == RELEASE
    values = yaml.safe_load(config["spec"]["valuesContent"])
    sets = list(yaml.safe_load((FIXTURES / "rke2-helmchart-set.yaml").read_text()).items())
    text = h.render(values, sets=sets)
    (out / "guest-rancher.yaml").write_text(text)
    docs = objects(text)
    name = values["global"]["cattle"]["clusterName"]
    path = values["cloudConfigPath"]

    # Harvester's CSI driver: Deployment kube-system/harvester-cloud-provider, its container
    # harvester-cloud-provider, the argument --cluster-name=<name>.
    hcp = find(docs, "Deployment", "harvester-cloud-provider")
    args = container(hcp, "harvester-cloud-provider")["args"]
    if f"--cluster-name={name}" not in args:
        fail(f"the cloud provider's args lack --cluster-name={name} (Harvester's CSI driver reads it there): {args}")
    if "--controllers=*,-service" not in args:
        fail(f"the cloud provider's service controller is not off: {args}")
    ccm = find(docs, "Deployment", "harvester-cloud-ccm")
    ccm_args = container(ccm, "ccm")["args"]
    for want in ("ccm", "--cloud-config=/etc/kubernetes/cloud-config", f"--cluster-name={name}"):
        if want not in ccm_args:
            fail(f"harvester-cloud-ccm's args lack {want}: {ccm_args}")
    for workload in (hcp, ccm):
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        if volumes.get("cloud-config", {}).get("hostPath") != {"path": path, "type": "File"}:
            fail(f"{workload['metadata']['name']} does not mount the cloud-config {path}: {volumes}")
    # Root reads the node's cloud-config (root's, 0600), without a capability.
    security = ccm["spec"]["template"]["spec"]["securityContext"]
    if security.get("runAsUser") != 0 or container(ccm, "ccm")["securityContext"]["capabilities"] != {"drop": ["ALL"]}:
        fail(f"harvester-cloud-ccm cannot read the node's cloud-config as root without capabilities: {security}")

    # RKE2's system-default registry (airgapped clusters) reaches every image.
    text = h.render(values, sets=sets + [("global.systemDefaultRegistry", "registry.example.com:5000")])
    (out / "guest-rancher-registry.yaml").write_text(text)
    for owner, image in images(objects(text)):
        if not image.startswith("registry.example.com:5000/"):
            fail(f"{owner}'s image {image} ignores RKE2's global.systemDefaultRegistry")
    return values


def check_defaults(h, out):
    text = h.render()
    (out / "guest-defaults.yaml").write_text(text)
    docs = objects(text)
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    want = {("Deployment", "harvester-cloud-ccm"), ("Deployment", "harvester-cloud-provider"),
            ("DaemonSet", "kube-vip"), ("ClusterRole", "kube-vip"), ("Role", "kube-vip")}
    if not want <= set(kinds):
        fail(f"the default rendering lacks {want - set(kinds)}")
    ccm = find(docs, "Deployment", "harvester-cloud-ccm")
    if any(a.startswith("--cluster-name") for a in container(ccm, "ccm")["args"]):
        fail("with no cluster name the ccm must keep its default (kubernetes, with upstream's warning)")

    # kube-vip in services mode, ARP, every Service announced by its leader; the DHCP client and
    # ARP need NET_ADMIN and NET_RAW on the host's network.
    ds = find(docs, "DaemonSet", "kube-vip")
    kv = container(ds, "kube-vip")
    env = env_of(kv)
    for name, value in {"svc_enable": "true", "vip_arp": "true", "cp_enable": "false",
                        "svc_election": "false", "vip_subnet": "32"}.items():
        if env.get(name) != value:
            fail(f"kube-vip's {name} is {env.get(name)!r}, not {value!r}")
    if not ds["spec"]["template"]["spec"].get("hostNetwork"):
        fail("kube-vip is not on the host's network")
    if set(kv["securityContext"]["capabilities"]["add"]) != {"NET_ADMIN", "NET_RAW"}:
        fail(f"kube-vip's capabilities: {kv['securityContext']}")
    if kv["args"][0] != "manager":
        fail(f"kube-vip's args: {kv['args']}")

    # externalTrafficPolicy: Local (harvester/harvester#6944): a leader per Service among the nodes
    # of its endpoints, so per-Service Leases and the EndpointSlices.
    rules = find(docs, "ClusterRole", "kube-vip")["rules"]

    def allowed(group, resource, verbs):
        return any(group in r["apiGroups"] and resource in r["resources"] and set(verbs) <= set(r["verbs"])
                   for r in rules)
    for group, resource, verbs in [("coordination.k8s.io", "leases", ["get", "list", "watch", "create", "update"]),
                                   ("discovery.k8s.io", "endpointslices", ["get", "list", "watch"]),
                                   ("", "endpoints", ["get", "list", "watch"]),
                                   ("", "services/status", ["update"])]:
        if not allowed(group, resource, verbs):
            fail(f"kube-vip may not {verbs} {resource}: svc_election (externalTrafficPolicy: Local) needs it")
    local = objects(h.render({"kube-vip": {"env": {"svc_election": "true"}, "affinity": None}}))
    ds = find(local, "DaemonSet", "kube-vip")
    if env_of(container(ds, "kube-vip")).get("svc_election") != "true" or "affinity" in ds["spec"]["template"]["spec"]:
        fail("kube-vip.env.svc_election \"true\" with no affinity does not reach every node")

    # The cloud-config from a Secret: the ccm runs as non-root then.
    text = h.render({"cloudConfig": {"secretName": "hcp-cloud-config"}})
    (out / "guest-secret.yaml").write_text(text)
    ccm = find(objects(text), "Deployment", "harvester-cloud-ccm")
    spec = ccm["spec"]["template"]["spec"]
    if spec["securityContext"].get("runAsNonRoot") is not True:
        fail("with a Secret cloud-config harvester-cloud-ccm still runs as root")
    if spec["volumes"][0].get("secret", {}).get("secretName") != "hcp-cloud-config":
        fail(f"harvester-cloud-ccm does not mount the Secret: {spec['volumes']}")

    # Only the ccm (and kube-vip) without the node controllers.
    docs = objects(h.render({"nodeControllers": {"enabled": False}}))
    if any(d["metadata"]["name"] == "harvester-cloud-provider" for d in docs):
        fail("nodeControllers.enabled false still deploys Harvester's cloud provider")


def check_refusals(h):
    cases = [
        ({"extraArgs": ["--controllers=*"]}, "service controller"),
        ({"extraArgs": ["--controllers=cloud-node-controller,service"]}, "service controller"),
        ({"extraArgs": ["--controllers=service-lb-controller,-service"]}, "service controller"),
        ({"extraArgs": ["--controllers", "*"]}, "one argument"),
        ({"cloudConfigPath": "", "cloudConfig": {"hostPath": ""}}, "no cloud-config"),
        ({"kube-vip": {"env": {"cp_enable": "true"}}}, "kube-vip.config.address"),
        ({"image": {"tag": ""}}, "image.tag"),
    ]
    for values, message in cases:
        ok, _, err = h.template(values, expect_ok=False)
        if ok or message not in err:
            fail(f"{values} should be refused with a message about {message!r}; helm said: {err.strip() or 'ok'}")
    for values in ({"extraArgs": ["--controllers=*,-service"]},
                   {"extraArgs": ["--controllers=cloud-node-controller,cloud-node-lifecycle-controller"]}):
        ok, text, err = h.template(values, expect_ok=False)
        if not ok:
            fail(f"{values} is refused: {err.strip()}")
            continue
        args = container(find(objects(text), "Deployment", "harvester-cloud-provider"), "harvester-cloud-provider")["args"]
        controllers = [a for a in args if a.startswith("--controllers")]
        if controllers != values["extraArgs"]:
            fail(f"with {values} the cloud provider gets {controllers}")


def check_extra_args_reach_ccm(h):
    """The cloud provider's --cluster-name and --management-network in extraArgs also configure the
    ccm; global.cattle.clusterName and harvesterCloud.managementNetwork win."""
    extra = {"extraArgs": ["--cluster-name=from-args", "--management-network=default/vlan100"]}
    args = container(find(objects(h.render(extra)), "Deployment", "harvester-cloud-ccm"), "ccm")["args"]
    for want in ("--cluster-name=from-args", "--management-network=default/vlan100"):
        if want not in args:
            fail(f"extraArgs {want} does not reach harvester-cloud-ccm: {args}")
    ours = merge(extra, {"global": {"cattle": {"clusterName": "gc1"}},
                         "harvesterCloud": {"managementNetwork": "default/mgmt"}})
    args = container(find(objects(h.render(ours)), "Deployment", "harvester-cloud-ccm"), "ccm")["args"]
    for want in ("--cluster-name=gc1", "--management-network=default/mgmt"):
        if want not in args:
            fail(f"{want} should win over extraArgs: {args}")


def check_ccm_rbac(docs):
    manifest = objects(CCM_MANIFEST.read_text())
    for kind in ("ClusterRole", "Role"):
        ours = find(docs, kind, "harvester-cloud-ccm")["rules"]
        theirs = find(manifest, kind, "harvester-cloud-ccm")["rules"]
        if ours != theirs:
            fail(f"the chart's {kind} harvester-cloud-ccm differs from {CCM_MANIFEST.relative_to(ROOT)}'s "
                 f"(which tests/guest_lb runs the ccm with):\n{ours}\n{theirs}")
    for kind, namespace in (("Role", "kube-system"), ("RoleBinding", "kube-system")):
        if find(docs, kind, "harvester-cloud-ccm")["metadata"]["namespace"] != namespace:
            fail(f"the ccm's {kind} must be in {namespace} (its Lease and the NAD mapping are there)")


def check_helmchart(h, out):
    """(d): the HelmChart example: helm.cattle.io's shape, the name Rancher's HelmChartConfig applies
    to, and its values."""
    doc = yaml.safe_load(HELMCHART.read_text())
    spec = doc.get("spec", {})
    expect = {"apiVersion": (doc.get("apiVersion"), "helm.cattle.io/v1"),
              "kind": (doc.get("kind"), "HelmChart"),
              "metadata.name": (doc["metadata"].get("name"), RELEASE),
              "metadata.namespace": (doc["metadata"].get("namespace"), "kube-system"),
              "spec.chart": (spec.get("chart"), RELEASE),
              "spec.targetNamespace": (spec.get("targetNamespace"), "kube-system"),
              "spec.bootstrap": (spec.get("bootstrap"), True)}
    for field, (have, want) in expect.items():
        if have != want:
            fail(f"{HELMCHART.relative_to(ROOT)}: {field} is {have!r}, not {want!r}")
    for field in ("repo", "version", "valuesContent"):
        if not isinstance(spec.get(field), str) or not spec[field]:
            fail(f"{HELMCHART.relative_to(ROOT)}: spec.{field} is missing")
    known = {"bootstrap", "chart", "repo", "version", "targetNamespace", "valuesContent", "set",
             "helmVersion", "jobImage", "timeout", "failurePolicy", "createNamespace", "chartContent"}
    if set(spec) - known:
        fail(f"{HELMCHART.relative_to(ROOT)}: fields helm.cattle.io/v1 HelmChart does not have: {set(spec) - known}")
    values = yaml.safe_load(spec.get("valuesContent", "")) or {}
    text = h.render(values)
    (out / "guest-helmchart.yaml").write_text(text)
    args = container(find(objects(text), "Deployment", "harvester-cloud-ccm"), "ccm")["args"]
    name = values.get("global", {}).get("cattle", {}).get("clusterName")
    if f"--cluster-name={name}" not in args:
        fail(f"the HelmChart's clusterName does not reach harvester-cloud-ccm: {args}")


def check_ccm_args(binary, out):
    """`harvester-cloud` parses the ccm arguments of every rendering: it gets as far as reading the
    cloud-config (which is on the nodes, not here), not stopping at an argument. It runs in a new
    network namespace, so the rendered --metrics-listen binds there and nowhere else."""
    isolate = []
    if subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0:
        isolate = ["unshare", "-rn"]
    checked = 0
    for rendering in sorted(out.glob("guest-*.yaml")):
        if rendering.name.endswith("-values.yaml"):
            continue
        for d in objects(rendering.read_text()):
            if d.get("kind") != "Deployment" or d["metadata"]["name"] != "harvester-cloud-ccm":
                continue
            c = container(d, "ccm")
            args = list(c["args"])
            if not isolate:
                args = [a if not a.startswith("--metrics-listen=") else "--metrics-listen=127.0.0.1:0" for a in args]
            env = {k: v for k, v in os.environ.items() if not k.startswith("HARVESTER_CLOUD_")}
            env.update({e["name"]: e["value"] for e in c.get("env", []) if "value" in e})
            run = subprocess.run(isolate + [binary] + args, capture_output=True, text=True, env=env, timeout=60)
            said = run.stdout + run.stderr
            if run.returncode == 0 or "cannot read --cloud-config /etc/kubernetes/cloud-config" not in said:
                fail(f"{rendering.name}: harvester-cloud does not accept the ccm's arguments {args} "
                     f"(exit {run.returncode}):\n{said}")
            checked += 1
    if checked < 5:
        fail(f"only {checked} renderings had harvester-cloud-ccm's arguments to check")
    print(f"harvester-cloud accepts the ccm arguments of {checked} renderings")


def pod_spec_for_diff(workload):
    spec = copy.deepcopy(workload["spec"]["template"]["spec"])
    for c in spec.get("containers", []):
        c["env"] = sorted(c.get("env", []), key=lambda e: e["name"])
        if not c.get("resources"):
            c.pop("resources", None)
    return spec


def check_against_upstream(h, upstream, values_sets):
    """Upstream's chart, rendered with the same values, deploys the same kube-vip and the same cloud
    provider pod, but for what we change on purpose: the cloud provider's --controllers (service
    controller off) and pull secrets, and the registry prefix on kube-vip's image."""
    _, _, chart = upstream
    compared = 0
    # The same cloud provider image on both sides (the defaults differ: upstream's is a development tag).
    same_image = {"image": {"tag": "v0.2.8", "pullPolicy": "IfNotPresent"}}
    for label, values in values_sets:
        values = merge(same_image, values)
        theirs = objects(h.render(values, chart=chart))
        ours = objects(h.render(values))
        for kind in ("DaemonSet", "Deployment"):
            # Ours has harvester-cloud-ccm besides; the rest is upstream's, by name.
            mine = {d["metadata"]["name"]: d for d in ours
                    if d.get("kind") == kind and d["metadata"]["name"] != "harvester-cloud-ccm"}
            upstreams = {d["metadata"]["name"]: d for d in theirs if d.get("kind") == kind}
            if set(mine) != set(upstreams):
                fail(f"{label}: upstream's chart renders {kind}s {sorted(upstreams)}, ours {sorted(mine)}")
                continue
            for name in sorted(mine):
                sa, sb = pod_spec_for_diff(mine[name]), pod_spec_for_diff(upstreams[name])
                if kind == "Deployment":
                    ca = sa["containers"][0]
                    ca["args"] = [x for x in ca["args"] if not x.startswith("--controllers=")]
                    sa.pop("imagePullSecrets", None)
                for s in (sa, sb):
                    s.pop("serviceAccountName", None)
                if sa != sb:
                    fail(f"{label}: our {kind} {name} differs from upstream's:\n ours: {sa}\n upstream: {sb}")
                compared += 1
        for kind in ("ClusterRole", "Role"):
            mine = [d for d in ours if d.get("kind") == kind and d["metadata"]["name"] != "harvester-cloud-ccm"]
            upstreams = [d for d in theirs if d.get("kind") == kind]

            def grants(docs):
                return {(g, r, v) for d in docs for rule in d["rules"] for g in rule["apiGroups"]
                        for r in rule["resources"] for v in rule["verbs"]}
            if grants(mine) != grants(upstreams):
                fail(f"{label}: the {kind}s grant {sorted(grants(mine) ^ grants(upstreams))} "
                     f"on one side only")
    print(f"upstream's chart as the oracle: {compared} workloads compared")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--helm", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--bin", help="the harvester-cloud binary, to check the ccm's arguments")
    parser.add_argument("--upstream", default=os.environ.get("HARVESTER_UPSTREAM_CHARTS"),
                        help="a harvester/charts checkout or git repository (default $HARVESTER_UPSTREAM_CHARTS)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="guest-chart-")
    h = Helm(args.helm, scratch)

    lint = subprocess.run([args.helm, "lint", "--strict", str(CHART)], capture_output=True, text=True)
    if lint.returncode != 0:
        fail(f"helm lint --strict:\n{lint.stdout}{lint.stderr}")

    ours = yaml.safe_load((CHART / "values.yaml").read_text())
    table = yaml.safe_load((FIXTURES / "upstream-keys.yaml").read_text())
    upstream = upstream_files(args.upstream)
    if upstream:
        # For check-manifests.sh's switch to this chart and back on the control plane.
        shutil.copytree(upstream[2], args.out / "upstream-chart", dirs_exist_ok=True)
        keys = upstream_keys(upstream)
        print(f"upstream's keys: {len(keys)}, read from {args.upstream}")
        extra = {tuple(e["key"]) for e in table} - set(keys)
        if extra:
            print(f"note: upstream no longer has {sorted('.'.join(k) for k in extra)}; still accepted here")
    else:
        keys = [tuple(e["key"]) for e in table]
        print(f"upstream's keys: {len(keys)}, from tests/guest_chart/upstream-keys.yaml "
              f"(HARVESTER_UPSTREAM_CHARTS unset: no upstream chart to read them from or compare with)")

    check_defaults(h, args.out)
    rancher = check_rancher(h, args.out)
    every = check_keys(h, table, keys, ours, args.out)
    ok, text, err = h.template(every, expect_ok=False)
    if not ok:
        fail(f"the every-key values are refused: {err}")
    (args.out / "guest-every-key.yaml").write_text(text)
    check_refusals(h)
    check_extra_args_reach_ccm(h)
    check_ccm_rbac(objects((args.out / "guest-defaults.yaml").read_text()))
    check_helmchart(h, args.out)
    if args.bin:
        check_ccm_args(args.bin, args.out)
    if upstream:
        # Upstream ignores these keys (its templates never read them): left at their defaults here.
        ignored_upstream = [("imagePullSecrets",), ("fullnameOverride",), ("serviceAccount", "name"),
                            ("kube-vip", "serviceAccount", "create"), ("kube-vip", "serviceAccount", "name"),
                            ("kube-vip", "fullnameOverride"), ("global", "cattle", "systemDefaultRegistry")]
        comparable = copy.deepcopy(every)
        for key in ignored_upstream:
            parent = comparable
            for part in key[:-1]:
                parent = parent.get(part, {})
            parent.pop(key[-1], None)
        check_against_upstream(h, upstream, [("defaults", {}), ("Rancher's values", rancher),
                                             ("every key", comparable),
                                             ("svc_election", {"kube-vip": {"env": {"svc_election": "true"}, "affinity": None}})])
    shutil.rmtree(scratch, ignore_errors=True)
    if upstream:
        shutil.rmtree(upstream[2].parent, ignore_errors=True)
    print(f"guest chart: {h.count} renderings, {len(keys)} upstream keys, {len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
