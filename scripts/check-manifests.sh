#!/usr/bin/env bash
# Checks what ships for Kubernetes: lints and renders the Helm chart with the real helm, checks that
# deploy/manifests/harvester-cloud.yaml is the chart rendered for plain `kubectl apply` and that the
# chart's CRDs are deploy/crds (which tests/crds.rs checks against `harvester-cloud crds`), and
# validates every manifest and rendering with kubernetes-validate against the Kubernetes schemas
# (also deploy/ccm, the guest cluster's ccm, whose RBAC tests/guest_lb/ runs the ccm with).
# The guest chart (deploy/guest-chart/harvester-cloud-provider, in place of the Harvester Cloud
# Provider's) goes through scripts/check-guest-chart.py (upstream's values keys, Rancher's values,
# the ccm's arguments against the built binary; HARVESTER_UPSTREAM_CHARTS, a harvester/charts
# checkout, adds upstream's chart as the oracle), and its renderings and HelmChart example through
# the same validation and dry runs; with a control plane, `harvester-cloud ccm` also runs there with
# the chart's arguments until it leads. HARVESTER_CLOUD_BIN names the binary (default: cargo build).
# With a real control plane (the first directory of HARVESTER_CLOUD_CONTROL_PLANES, as
# `scripts/control-plane.sh with 1 scripts/check-manifests.sh` sets it), the CRDs are also applied
# server-side and every rendering is applied with --dry-run=server, so kube-apiserver itself
# (schema validation, defaulting, admission) accepts what ships.
#
#   scripts/check-manifests.sh            check
#   scripts/check-manifests.sh --update   rewrite deploy/manifests/harvester-cloud.yaml
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HELM="${HELM:-$("$ROOT/scripts/install-helm.sh")}"
if [[ -z "${HARVESTER_CLOUD_BIN:-}" ]]; then
  (cd "$ROOT" && cargo build --quiet --bin harvester-cloud)
  HARVESTER_CLOUD_BIN="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/debug/harvester-cloud"
fi
CHART="$ROOT/deploy/chart/harvester-cloud"
MANIFEST="$ROOT/deploy/manifests/harvester-cloud.yaml"
RANCHER_MANIFEST="$ROOT/deploy/manifests/harvester-cloud-rancher.yaml"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

render_plain() {
  cat <<'HEADER'
# harvester-cloud for `kubectl apply -f`, rendered from deploy/chart/harvester-cloud with its default
# values (scripts/check-manifests.sh --update), into the namespace harvester-system.
#
# It expects a TLS Secret `harvester-cloud-tls` (tls.crt, tls.key) for the Service's DNS names
# (harvester-cloud.harvester-system.svc), and the webhook configurations need that certificate's CA
# as caBundle. The manual (docs/src/install.md) shows the commands. The Helm chart does both itself.
# Harvester's ClusterRoles harvesterhci.io:cloudprovider and harvesterhci.io:csi-driver are not in
# here: a Harvester cluster has them (the chart can create them where they are missing).
HEADER
  "$HELM" template harvester-cloud "$CHART" --namespace harvester-system --include-crds \
    --set tls.existingSecret=harvester-cloud-tls --set harvesterClusterRoles.create=false
}

# The same for a cluster where Rancher runs and its dashboard reaches the service through
# Rancher's aggregation (rancherApiService.enabled: the APIService and its RBAC).
render_rancher_body() {
  cat <<'HEADER'
# harvester-cloud for `kubectl apply -f` where Rancher runs (Harvester's embedded Rancher): as
# harvester-cloud.yaml, plus the Rancher APIService that routes the dashboard's
# /v1/harvester/kubeconfig to the service and the RBAC to keep it (scripts/check-manifests.sh
# --update renders both from deploy/chart/harvester-cloud).
HEADER
  "$HELM" template harvester-cloud "$CHART" --namespace harvester-system --include-crds \
    --set tls.existingSecret=harvester-cloud-tls --set harvesterClusterRoles.create=false \
    --set rancherApiService.enabled=true
}

if [[ "${1:-}" == "--update" ]]; then
  render_plain > "$MANIFEST"
  render_rancher_body > "$RANCHER_MANIFEST"
  echo "wrote $MANIFEST and $RANCHER_MANIFEST"
fi

echo "helm lint"
"$HELM" lint --strict "$CHART" >/dev/null

echo "deploy/manifests is the rendered chart"
render_plain > "$WORK/plain.yaml"
diff -u "$MANIFEST" "$WORK/plain.yaml" || { echo "deploy/manifests/harvester-cloud.yaml is stale: run scripts/check-manifests.sh --update" >&2; exit 1; }
render_rancher_body > "$WORK/rancher.yaml"
diff -u "$RANCHER_MANIFEST" "$WORK/rancher.yaml" || { echo "deploy/manifests/harvester-cloud-rancher.yaml is stale: run scripts/check-manifests.sh --update" >&2; exit 1; }
grep -q "^kind: APIService" "$RANCHER_MANIFEST" || { echo "the Rancher rendering lacks its APIService" >&2; exit 1; }
if grep -q "kind: APIService" "$MANIFEST"; then echo "the default rendering has an APIService" >&2; exit 1; fi

echo "the chart's CRDs are deploy/crds"
for f in "$ROOT"/deploy/crds/*.yaml; do
  cmp "$f" "$CHART/crds/$(basename "$f")" || { echo "$CHART/crds/$(basename "$f") differs from deploy/crds" >&2; exit 1; }
done
[[ "$(ls "$CHART/crds" | wc -l)" == "$(ls "$ROOT/deploy/crds" | wc -l)" ]] || { echo "the chart's crds/ has extra files" >&2; exit 1; }

echo "renderings with other values"
"$HELM" template hc "$CHART" --namespace harvester-system > "$WORK/generated-tls.yaml"
grep -q "kind: Secret" "$WORK/generated-tls.yaml" || { echo "the chart did not generate its TLS Secret" >&2; exit 1; }
grep -q "caBundle: " "$WORK/generated-tls.yaml" || { echo "the webhooks lack the generated caBundle" >&2; exit 1; }
"$HELM" template other "$CHART" --namespace tools \
  --set replicaCount=3,leaderElection=false,allowRestrictedAdmin=true,webhook.enabled=false \
  --set podDisruptionBudget.enabled=false,harvesterClusterRoles.create=false,tls.existingSecret=my-tls \
  --set tls.caBundle=Zm9v,image.tag=dev > "$WORK/custom.yaml"
if grep -q "MutatingWebhookConfiguration\|harvesterhci.io:csi-driver\"$" "$WORK/custom.yaml"; then
  echo "disabled parts were rendered" >&2; exit 1
fi

echo "the guest chart (scripts/check-guest-chart.py)"
python3 "$ROOT/scripts/check-guest-chart.py" --helm "$HELM" --out "$WORK/guest" --bin "$HARVESTER_CLOUD_BIN"
# Its PodMonitor (kube-vip.podMonitor.enabled) is the Prometheus Operator's kind: checked for shape
# here, left out of the schema validation and the dry runs (no such CRD on the control plane).
python3 - "$WORK/guest" <<'PY'
import pathlib, sys, yaml
for f in sorted(pathlib.Path(sys.argv[1]).glob("guest-*.yaml")):
    if f.name.endswith("-values.yaml"):
        continue
    docs = [d for d in yaml.safe_load_all(f.read_text()) if d]
    for d in docs:
        if d["kind"] == "PodMonitor":
            assert d["apiVersion"] == "monitoring.coreos.com/v1", d
            assert d["spec"]["podMetricsEndpoints"] == [{"port": "monitoring"}], d
            assert d["spec"]["selector"]["matchLabels"], d
    core = [d for d in docs if d["kind"] != "PodMonitor"]
    f.with_name(f.stem + ".core.yml").write_text(yaml.safe_dump_all(core))
PY
GUEST=("$WORK"/guest/guest-*.core.yml)
[[ ${#GUEST[@]} -ge 6 ]] || { echo "the guest chart was rendered ${#GUEST[@]} times, not 6" >&2; exit 1; }

echo "kubernetes-validate"
# The APIService is Rancher's custom resource, unknown to the Kubernetes schemas: left out here,
# checked by kube-apiserver below (with Rancher's CRD) and by tests/rancher_aggregation.rs.
python3 - "$RANCHER_MANIFEST" > "$WORK/rancher-core.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") != "APIService"]
print(yaml.safe_dump_all(docs))
PY
kubernetes-validate --strict --quiet \
  "$MANIFEST" "$WORK/rancher-core.yaml" "$WORK/generated-tls.yaml" "$WORK/custom.yaml" "$ROOT"/deploy/crds/*.yaml \
  "$ROOT/deploy/ccm/harvester-cloud-ccm.yaml" "${GUEST[@]}"
# HelmChart is helm.cattle.io's custom resource, unknown to the Kubernetes schemas: check its shape.
python3 - "$ROOT/deploy/helmchart.yaml" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
assert doc["apiVersion"] == "helm.cattle.io/v1" and doc["kind"] == "HelmChart", doc
spec = doc["spec"]
for key in ("chart", "repo", "version", "targetNamespace", "valuesContent"):
    assert isinstance(spec.get(key), str) and spec[key], f"spec.{key} missing"
yaml.safe_load(spec["valuesContent"])
PY
if [[ -n "${HARVESTER_CLOUD_CONTROL_PLANES:-}" ]]; then
  CP="${HARVESTER_CLOUD_CONTROL_PLANES%%:*}"
  echo "kube-apiserver accepts them ($CP)"
  k() { kubectl --kubeconfig "$CP/admin.kubeconfig" "$@"; }
  # The same lease the tests take, so no test runs on this control plane meanwhile.
  exec 9>"$CP/lease.lock"
  flock 9
  k apply --server-side --field-manager=check-manifests -f "$ROOT/deploy/crds/" >/dev/null
  # Rancher's APIService kind, as Rancher installs it (wrangler's CRD of Rancher's Go type, from
  # tools/rancher-crds; every control plane carries it in foreign/crds).
  k apply --server-side --field-manager=check-manifests \
    -f "$CP/foreign/crds/apiservices.management.cattle.io.json" >/dev/null
  k wait --for=condition=Established crd/apiservices.management.cattle.io --timeout=60s >/dev/null
  for ns in harvester-system tools kube-vip-system; do
    k create namespace "$ns" --dry-run=client -o yaml | k apply --server-side -f - >/dev/null
  done
  for f in "$MANIFEST" "$RANCHER_MANIFEST" "$WORK/generated-tls.yaml" "$WORK/custom.yaml" "$ROOT/deploy/ccm/harvester-cloud-ccm.yaml" "${GUEST[@]}"; do
    k apply --server-side --field-manager=check-manifests --dry-run=server -f "$f" >/dev/null ||
      { echo "kube-apiserver refused $f" >&2; exit 1; }
  done

  echo "the guest chart's install notes (helm install --dry-run=client)"
  notes() {
    "$HELM" install harvester-cloud-provider "$ROOT/deploy/guest-chart/harvester-cloud-provider" \
      --namespace kube-system --dry-run=client --kubeconfig "$CP/admin.kubeconfig" "$@" | sed -n '/^NOTES:/,$p'
  }
  say_notes() { echo "the guest chart's notes $1:" >&2; shift; notes "$@" >&2; exit 1; }
  notes | grep -q "global.cattle.clusterName is empty" || say_notes "do not warn of an empty cluster name"
  notes --set global.cattle.clusterName=gc1 | grep -q "is empty" && say_notes "warn of a cluster name that is set" --set global.cattle.clusterName=gc1
  local_values=(--set global.cattle.clusterName=gc1 --set kube-vip.env.svc_election=true)
  notes "${local_values[@]}" | grep -q "svc_election" || say_notes "do not warn of svc_election on control planes only" "${local_values[@]}"
  notes "${local_values[@]}" --set kube-vip.affinity=null | grep -q "svc_election" &&
    say_notes "warn of svc_election with kube-vip on every node" "${local_values[@]}" --set kube-vip.affinity=null

  echo "harvester-cloud ccm runs with the guest chart's arguments (Rancher's values) until it leads"
  # The control plane is both clusters: the guest's API (in-cluster in a pod, KUBECONFIG here) and
  # Harvester's (the cloud-config, its context in namespace gc-chart-check). Two arguments name
  # what is elsewhere in a pod: the cloud-config's path on the node, and the metrics port (a free
  # one here); the rest is the rendering's, as written.
  CCM_ARGS=()
  while IFS= read -r -d '' arg; do CCM_ARGS+=("$arg"); done < <(python3 - "$WORK/guest/guest-rancher.yaml" <<'PY'
import socket, sys, yaml
ccm = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Deployment"
       and d["metadata"]["name"] == "harvester-cloud-ccm"][0]
args = ccm["spec"]["template"]["spec"]["containers"][0]["args"]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
for a in args:
    if a.startswith("--cloud-config="):
        a = "--cloud-config=CLOUD_CONFIG"
    elif a.startswith("--metrics-listen="):
        a = f"--metrics-listen=127.0.0.1:{port}"
    sys.stdout.write(a + "\0")
PY
)
  cp "$CP/admin.kubeconfig" "$WORK/cloud-config"
  kubectl --kubeconfig "$WORK/cloud-config" config set-context --current --namespace=gc-chart-check >/dev/null
  CCM_ARGS=("${CCM_ARGS[@]/CLOUD_CONFIG/$WORK/cloud-config}")
  METRICS="$(printf '%s\n' "${CCM_ARGS[@]}" | sed -n 's/^--metrics-listen=//p')"
  k -n kube-system delete lease harvester-cloud-ccm --ignore-not-found >/dev/null
  env -u HARVESTER_CLOUD_CONTROL_PLANES KUBECONFIG="$CP/admin.kubeconfig" \
    "$HARVESTER_CLOUD_BIN" "${CCM_ARGS[@]}" >"$WORK/ccm.log" 2>&1 &
  CCM_PID=$!
  led=""
  for _ in $(seq 1 120); do
    kill -0 "$CCM_PID" 2>/dev/null || break
    if curl -fsS "http://$METRICS/metrics" 2>/dev/null | grep -q '^harvester_cloud_leader 1'; then led=yes; break; fi
    sleep 0.5
  done
  holder="$(k -n kube-system get lease harvester-cloud-ccm -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)"
  kill -TERM "$CCM_PID" 2>/dev/null || true
  rc=0; wait "$CCM_PID" || rc=$?
  # Leave the control plane as the tests expect it: no Lease, no NAD mapping of this run.
  k -n kube-system delete lease harvester-cloud-ccm --ignore-not-found >/dev/null
  k -n kube-system delete configmap harvester-nad-mapping --ignore-not-found >/dev/null
  if [[ -z "$led" || -z "$holder" || "$rc" != 0 ]]; then
    echo "harvester-cloud ccm ${CCM_ARGS[*]} did not lead and stop cleanly (led: ${led:-no}, Lease holder: ${holder:-none}, exit $rc):" >&2
    cat "$WORK/ccm.log" >&2
    exit 1
  fi

  if [[ -d "$WORK/guest/upstream-chart" ]]; then
    echo "helm switches a release of upstream's chart to the guest chart and back, in place"
    # Real helm against kube-apiserver, with Rancher's values: the objects both charts have are
    # updated (the same uid before and after), none is refused (a Deployment's or DaemonSet's
    # selector cannot change), and harvester-cloud-ccm comes and goes with the guest chart.
    hk() { "$HELM" --kubeconfig "$CP/admin.kubeconfig" --namespace kube-system "$@"; }
    python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["spec"]["valuesContent"])' \
      "$ROOT/tests/guest_chart/rancher-helmchartconfig.yaml" > "$WORK/rancher-values.json"
    switched() { hk uninstall harvester-cloud-provider --wait >/dev/null 2>&1 || true; }
    trap 'switched; rm -rf "$WORK"' EXIT
    uids() {
      k -n kube-system get deployment/harvester-cloud-provider daemonset/kube-vip \
        -o jsonpath='{range .items[*]}{.kind}/{.metadata.name}={.metadata.uid} {end}'
    }
    has_ccm() { k -n kube-system get deployment harvester-cloud-ccm >/dev/null 2>&1; }
    hk install harvester-cloud-provider "$WORK/guest/upstream-chart" -f "$WORK/rancher-values.json" >/dev/null
    before="$(uids)"
    [[ "$before" == *Deployment/harvester-cloud-provider=* && "$before" == *DaemonSet/kube-vip=* ]] ||
      { echo "upstream's chart did not install its Deployment and DaemonSet: $before" >&2; exit 1; }
    hk upgrade harvester-cloud-provider "$ROOT/deploy/guest-chart/harvester-cloud-provider" -f "$WORK/rancher-values.json" >/dev/null
    [[ "$(uids)" == "$before" ]] || { echo "switching to the guest chart replaced objects: $before -> $(uids)" >&2; exit 1; }
    has_ccm || { echo "the guest chart's release has no harvester-cloud-ccm" >&2; exit 1; }
    k -n kube-system get deployment harvester-cloud-provider -o jsonpath='{.spec.template.spec.containers[0].args}' |
      grep -q -- '--controllers=\*,-service' || { echo "after the switch the cloud provider's service controller is on" >&2; exit 1; }
    hk upgrade harvester-cloud-provider "$WORK/guest/upstream-chart" -f "$WORK/rancher-values.json" >/dev/null
    [[ "$(uids)" == "$before" ]] || { echo "switching back replaced objects: $before -> $(uids)" >&2; exit 1; }
    has_ccm && { echo "switching back left harvester-cloud-ccm behind" >&2; exit 1; }
    switched
    trap 'rm -rf "$WORK"' EXIT
    if k get clusterrole kube-vip harvester-cloud-provider harvester-cloud-ccm >/dev/null 2>&1; then
      echo "helm uninstall left ClusterRoles behind" >&2; exit 1
    fi
  else
    echo "SKIPPED: switching a release of upstream's chart (HARVESTER_UPSTREAM_CHARTS is not set)"
  fi
  flock -u 9
fi
echo "manifests: ok"
