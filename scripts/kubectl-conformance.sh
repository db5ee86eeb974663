#!/usr/bin/env bash
# Drives the Kubernetes API fake (crates/kube-fake, binary fake-apiserver) with the real kubectl and
# fails on any divergence from what a real API server answers. Called from .ci/run.
#
# Env: FAKE_APISERVER_BIN  use this binary instead of building it
#      KUBECTL             kubectl to use (default: kubectl)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KUBECTL="${KUBECTL:-kubectl}"
WORK="$(mktemp -d)"
SERVER_PID=""
WATCH_PID=""

cleanup() {
  [[ -n "$WATCH_PID" ]] && kill "$WATCH_PID" 2>/dev/null || true
  [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

if [[ -z "${FAKE_APISERVER_BIN:-}" ]]; then
  echo "building fake-apiserver..."
  (cd "$ROOT" && CARGO_PROFILE_DEV_DEBUG=0 cargo build --quiet -p kube-fake --bin fake-apiserver)
  FAKE_APISERVER_BIN="$ROOT/target/debug/fake-apiserver"
fi

ADMIN="$WORK/admin.kubeconfig"
"$FAKE_APISERVER_BIN" --listen 127.0.0.1:0 --write-kubeconfig "$ADMIN" --token-delay-ms 200 2>"$WORK/server.log" &
SERVER_PID=$!
for _ in $(seq 1 300); do
  [[ -s "$ADMIN" ]] && break
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log"; echo "fake-apiserver exited"; exit 1; }
  sleep 0.1
done
[[ -s "$ADMIN" ]] || { echo "no kubeconfig after 30s"; exit 1; }
export KUBECONFIG="$ADMIN"

PASSED=0
FAILED=0
k() { "$KUBECTL" --request-timeout=20s "$@"; }

# check NAME EXPECTED ACTUAL
check() {
  if [[ "$2" == "$3" ]]; then
    PASSED=$((PASSED + 1)); echo "ok   $1"
  else
    FAILED=$((FAILED + 1)); echo "FAIL $1"
    diff <(printf '%s\n' "$2") <(printf '%s\n' "$3") | sed 's/^/     /' || true
  fi
}
# run CMD...: sets OUT (stdout+stderr) and RC without tripping set -e
run() { if OUT="$("$@" 2>&1)"; then RC=0; else RC=$?; fi; }
# wait_for DESCRIPTION CMD...: retries CMD until it succeeds (30 s)
wait_for() {
  local what="$1"; shift
  for _ in $(seq 1 300); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  FAILED=$((FAILED + 1)); echo "FAIL timed out waiting for $what"; return 1
}

echo "== discovery"
check "server version" "1.32" "$(k version -o json | jq -r '.serverVersion.major + "." + .serverVersion.minor')"
check "api-versions" "admissionregistration.k8s.io/v1
apiextensions.k8s.io/v1
authentication.k8s.io/v1
authorization.k8s.io/v1
coordination.k8s.io/v1
events.k8s.io/v1
rbac.authorization.k8s.io/v1
v1" "$(k api-versions)"
check "api-resources core" "configmaps cm v1 true ConfigMap
events ev v1 true Event
namespaces ns v1 false Namespace
secrets v1 true Secret
serviceaccounts sa v1 true ServiceAccount
services svc v1 true Service" "$(k api-resources --api-group='' --no-headers | awk '{$1=$1; print}')"
check "api-resources verbs" "leases coordination.k8s.io/v1 true Lease create,delete,deletecollection,get,list,patch,update,watch" \
  "$(k api-resources --api-group=coordination.k8s.io -o wide --no-headers | awk '{$1=$1; print}')"

echo "== create -f"
cat >"$WORK/base.yaml" <<'EOF'
apiVersion: v1
kind: Namespace
metadata:
  name: conf
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: web
  namespace: conf
  labels: {app: web, tier: front}
data: {k: v1}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: db
  namespace: conf
  labels: {app: db}
data: {k: v1}
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: conf
  labels: {app: web}
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080}
EOF
check "create -f" "namespace/conf created
configmap/web created
configmap/db created
service/web created" "$(k create -f "$WORK/base.yaml")"
run k create -f "$WORK/base.yaml"
check "create existing is AlreadyExists" "1
Error from server (AlreadyExists): error when creating \"$WORK/base.yaml\": namespaces \"conf\" already exists" "$RC
$(printf '%s\n' "$OUT" | head -1)"
check "service defaults" "ClusterIP TCP 8080 None" "$(k get svc web -n conf -o jsonpath='{.spec.type} {.spec.ports[0].protocol} {.spec.ports[0].targetPort} {.spec.sessionAffinity}')"
check "default service account and root CA appear" "serviceaccount/default configmap/kube-root-ca.crt" \
  "$(k get sa -n conf -o name) $(k get cm kube-root-ca.crt -n conf -o name)"
run k create configmap orphan -n missing-ns --from-literal=a=b
check "namespace must exist" "error: failed to create configmap: namespaces \"missing-ns\" not found" "$OUT"

echo "== get -l / field selectors"
check "get -l app=web" "configmap/web" "$(k get cm -n conf -l app=web -o name)"
check "get -l 'app in (web,db)'" "configmap/db
configmap/web" "$(k get cm -n conf -l 'app in (web,db)' -o name)"
check "get -l '!tier'" "configmap/db" "$(k get cm -n conf -l '!tier,app' -o name)"
check "get -l app!=web" "configmap/db" "$(k get cm -n conf -l 'app,app!=web' -o name)"
check "get --field-selector" "configmap/db" "$(k get cm -n conf --field-selector metadata.name=db -o name)"
check "table output" "NAME   DATA" "$(k get cm db -n conf | head -1 | awk '{print $1 "   " $2}')"

echo "== apply"
sed -i 's/data: {k: v1}/data: {k: v2}/' "$WORK/base.yaml"
run k apply -f "$WORK/base.yaml"
check "apply configures" "0 configmap/web configured" "$RC $(printf '%s\n' "$OUT" | grep '^configmap/web')"
check "apply wrote data" "v2" "$(k get cm web -n conf -o jsonpath='{.data.k}')"
check "apply again is unchanged" "configmap/web unchanged" "$(k apply -f "$WORK/base.yaml" 2>/dev/null | grep '^configmap/web')"
cat >"$WORK/ssa.yaml" <<'EOF'
apiVersion: v1
kind: ConfigMap
metadata:
  name: ssa
  namespace: conf
  labels: {app: ssa}
data: {owner: kubectl}
EOF
check "apply --server-side creates" "configmap/ssa serverside-applied" "$(k apply --server-side -f "$WORK/ssa.yaml")"
check "apply --server-side manager" "kubectl Apply" "$(k get cm ssa -n conf --show-managed-fields -o jsonpath='{.metadata.managedFields[0].manager} {.metadata.managedFields[0].operation}')"
sed 's/owner: kubectl/owner: other/' "$WORK/ssa.yaml" >"$WORK/ssa2.yaml"
run k apply --server-side --field-manager=other -f "$WORK/ssa2.yaml"
check "apply --server-side conflict" "1 conflict" "$RC $(printf '%s\n' "$OUT" | grep -o 'conflict' | head -1)"
check "apply --server-side --force-conflicts" "configmap/ssa serverside-applied other" \
  "$(k apply --server-side --field-manager=other --force-conflicts -f "$WORK/ssa2.yaml") $(k get cm ssa -n conf -o jsonpath='{.data.owner}')"

echo "== patch"
check "patch --type=json" "configmap/web patched" "$(k patch cm web -n conf --type=json -p '[{"op":"add","path":"/data/j","value":"1"}]')"
check "patch --type=merge" "configmap/web patched" "$(k patch cm web -n conf --type=merge -p '{"data":{"m":"2","k":null}}')"
check "patch strategic" "configmap/web patched" "$(k patch cm web -n conf -p '{"data":{"s":"3"}}')"
check "patched data" '{"j":"1","m":"2","s":"3"}' "$(k get cm web -n conf -o jsonpath='{.data}')"
check "no-op patch" "configmap/web patched (no change)" "$(k patch cm web -n conf --type=merge -p '{"data":{"s":"3"}}')"
run k patch cm web -n conf --type=json -p '[{"op":"test","path":"/data/s","value":"wrong"}]'
check "failed json patch test" "1" "$RC"
check "patch ports by merge key" "80:8080,81:81" "$(k patch svc web -n conf -p '{"spec":{"ports":[{"name":"metrics","port":81}]}}' >/dev/null; k get svc web -n conf -o jsonpath='{range .spec.ports[*]}{.port}:{.targetPort}{","}{end}' | sed 's/,$//')"

echo "== get -w"
k create configmap watched -n conf --from-literal=v=1 >/dev/null
k get cm watched -n conf -w --output-watch-events -o json >"$WORK/watch.json" 2>"$WORK/watch.err" &
WATCH_PID=$!
wait_for "watch to start" grep -q '"ADDED"' "$WORK/watch.json"
k patch cm watched -n conf --type=merge -p '{"data":{"v":"2"}}' >/dev/null
k patch cm watched -n conf --type=merge -p '{"data":{"v":"2"}}' >/dev/null
k patch cm watched -n conf --type=merge -p '{"data":{"v":"3"}}' >/dev/null
k delete cm watched -n conf >/dev/null
wait_for "watch DELETED event" grep -q '"DELETED"' "$WORK/watch.json"
kill "$WATCH_PID" 2>/dev/null || true
wait "$WATCH_PID" 2>/dev/null || true
WATCH_PID=""
check "watch events (no event for the no-op write)" "ADDED 1
MODIFIED 2
MODIFIED 3
DELETED 3" "$(jq -r '.type + " " + .object.data.v' "$WORK/watch.json")"
"$KUBECTL" get ns -w >"$WORK/table-watch.out" 2>&1 &
WATCH_PID=$!
table_row() { awk '$1=="conf"{found=1} END{exit !found}' "$WORK/table-watch.out"; }
wait_for "table watch rows" table_row
kill "$WATCH_PID" 2>/dev/null || true
wait "$WATCH_PID" 2>/dev/null || true
WATCH_PID=""
check "table watch prints rows" "NAME STATUS conf Active" \
  "$(head -1 "$WORK/table-watch.out" | awk '{print $1, $2}') $(awk '$1=="conf"{print $1, $2; exit}' "$WORK/table-watch.out")"

echo "== delete and finalizers"
check "delete" 'configmap "db" deleted' "$(k delete cm db -n conf)"
run k get cm db -n conf
check "get deleted is NotFound" "1 Error from server (NotFound): configmaps \"db\" not found" "$RC $OUT"
k create -f - >/dev/null <<'EOF'
apiVersion: v1
kind: ConfigMap
metadata: {name: held, namespace: conf, finalizers: [example.com/hold]}
EOF
k delete cm held -n conf --wait=false >/dev/null
check "finalizer holds deletion" "held 1" "$(k get cm held -n conf -o jsonpath='{.metadata.name} {.metadata.deletionTimestamp}' | awk '{print $1, ($2 != "")}')"
k patch cm held -n conf --type=json -p '[{"op":"remove","path":"/metadata/finalizers"}]' >/dev/null
run k get cm held -n conf
check "removing the last finalizer deletes" "1" "$RC"

echo "== custom resources"
cat >"$WORK/crd.yaml" <<'EOF'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: ippools.loadbalancer.harvesterhci.io
spec:
  group: loadbalancer.harvesterhci.io
  scope: Cluster
  names: {kind: IPPool, plural: ippools, singular: ippool, shortNames: [pool]}
  versions:
  - name: v1beta1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: NETWORK, type: string, jsonPath: .spec.selector.network}
    - {name: AVAILABLE, type: integer, jsonPath: .status.available}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              selector:
                type: object
                properties:
                  network: {type: string}
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
EOF
check "create CRD" "customresourcedefinition.apiextensions.k8s.io/ippools.loadbalancer.harvesterhci.io created" "$(k create -f "$WORK/crd.yaml")"
k wait --for condition=established --timeout=10s crd/ippools.loadbalancer.harvesterhci.io >/dev/null
check "CRD discovery" "ippools pool loadbalancer.harvesterhci.io/v1beta1 false IPPool" \
  "$(k api-resources --api-group=loadbalancer.harvesterhci.io --no-headers | awk '{$1=$1; print}')"
k apply -f - >/dev/null <<'EOF'
apiVersion: loadbalancer.harvesterhci.io/v1beta1
kind: IPPool
metadata: {name: pool1}
spec:
  selector: {network: default/vlan1, unknown: pruned}
status: {available: 9}
EOF
check "CR printer columns" "NAME NETWORK AVAILABLE
pool1 default/vlan1 " "$(k get pool | awk '{print $1, $2, $3}')"
check "CR pruned unknown field, ignored status on create" '{"network":"default/vlan1"} 1' \
  "$(k get pool pool1 -o jsonpath='{.spec.selector} {.metadata.generation}{.status}')"
k patch pool pool1 --subresource=status --type=merge -p '{"status":{"available":5}}' >/dev/null
k patch pool pool1 --type=merge -p '{"status":{"available":1},"metadata":{"labels":{"a":"b"}}}' >/dev/null
check "status subresource and generation" "5 1" "$(k get pool pool1 -o jsonpath='{.status.available} {.metadata.generation}')"
k patch pool pool1 --type=merge -p '{"spec":{"selector":{"network":"default/vlan2"}}}' >/dev/null
check "spec change bumps generation" "2" "$(k get pool pool1 -o jsonpath='{.metadata.generation}')"

echo "== RBAC and tokens"
cat >"$WORK/sa.yaml" <<'EOF'
apiVersion: v1
kind: ServiceAccount
metadata: {name: robot, namespace: conf}
---
apiVersion: v1
kind: Secret
metadata:
  name: robot-token
  namespace: conf
  annotations: {kubernetes.io/service-account.name: robot}
type: kubernetes.io/service-account-token
EOF
k create -f "$WORK/sa.yaml" >/dev/null
token_filled() { test -n "$(k get secret robot-token -n conf -o jsonpath='{.data.token}')"; }
wait_for "the token controller" token_filled
check "token secret filled" "ca.crt namespace token conf" \
  "$(k get secret robot-token -n conf -o json | jq -r '.data | keys | join(" ")') $(k get secret robot-token -n conf -o jsonpath='{.data.namespace}' | base64 -d)"
SA_TOKEN="$(k get secret robot-token -n conf -o jsonpath='{.data.token}' | base64 -d)"
SERVER="$(k config view --raw -o jsonpath='{.clusters[0].cluster.server}')"
k config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$WORK/ca.crt"
SAK="$WORK/sa.kubeconfig"
"$KUBECTL" config --kubeconfig "$SAK" set-cluster fake --server "$SERVER" --certificate-authority "$WORK/ca.crt" --embed-certs >/dev/null
"$KUBECTL" config --kubeconfig "$SAK" set-credentials robot --token "$SA_TOKEN" >/dev/null
"$KUBECTL" config --kubeconfig "$SAK" set-context fake --cluster fake --user robot --namespace conf >/dev/null
"$KUBECTL" config --kubeconfig "$SAK" use-context fake >/dev/null
check "kubeconfig is valid" "robot" "$("$KUBECTL" config --kubeconfig "$SAK" view --minify --raw -o jsonpath='{.users[0].name}')"
sak() { "$KUBECTL" --kubeconfig "$SAK" --request-timeout=20s "$@"; }
check "auth can-i as admin" "yes" "$(k auth can-i '*' '*')"
check "whoami as service account" "system:serviceaccount:conf:robot" "$(sak auth whoami -o jsonpath='{.status.userInfo.username}')"
run sak auth can-i list secrets
check "can-i without RBAC" "1 no" "$RC $OUT"
run sak get secrets
check "forbidden without RBAC" 'Error from server (Forbidden): secrets is forbidden: User "system:serviceaccount:conf:robot" cannot list resource "secrets" in API group "" in the namespace "conf"' "$OUT"
k create -f - >/dev/null <<'EOF'
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: reader, namespace: conf}
rules:
- {apiGroups: [""], resources: [secrets], verbs: [get, list]}
- {apiGroups: [rbac.authorization.k8s.io], resources: [rolebindings], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: robot-reader, namespace: conf}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}
subjects:
- {kind: ServiceAccount, name: robot, namespace: conf}
EOF
check "can-i with RBAC" "yes" "$(sak auth can-i list secrets)"
run sak auth can-i delete secrets
check "can-i verb not granted" "1 no" "$RC $OUT"
run sak auth can-i list secrets -n default
check "can-i other namespace" "1 no" "$RC $OUT"
check "get with RBAC" "secret/robot-token" "$(sak get secrets -o name)"
check "can-i --as service account" "yes" "$(k auth can-i list secrets -n conf --as=system:serviceaccount:conf:robot)"
run sak create rolebinding escalate --clusterrole=cluster-admin --serviceaccount=conf:robot
check "escalation prevented" "1 attempting to grant RBAC permissions not currently held" "$RC $(printf '%s\n' "$OUT" | grep -o 'attempting to grant RBAC permissions not currently held' | head -1)"
check "binding a role it holds" "rolebinding.rbac.authorization.k8s.io/again created" "$(sak create rolebinding again --role=reader --serviceaccount=conf:robot)"

echo "== create token / TokenReview"
BOUND="$(k create token robot -n conf --duration=10m)"
check "create token authenticates" "system:serviceaccount:conf:robot" "$(sak auth whoami --token "$BOUND" -o jsonpath='{.status.userInfo.username}')"
check "TokenReview" "true system:serviceaccount:conf:robot" "$(k create -o jsonpath='{.status.authenticated} {.status.user.username}' -f - <<EOF
{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "$SA_TOKEN"}}
EOF
)"
check "TokenReview of a bad token" "unauthenticated {}" "$(k create -o jsonpath='{.status.authenticated}unauthenticated {.status.user}' -f - <<'EOF'
{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "nope"}}
EOF
)"
run "$KUBECTL" --kubeconfig "$SAK" --token nope get cm
check "bad token is Unauthorized" "1 error: You must be logged in to the server (Unauthorized)" "$RC $OUT"

echo "== media types"
TOKEN="$(k config view --raw -o jsonpath='{.users[0].user.token}')"
CODE="$(printf 'k8s\x00\x0a\x09\x0a\x02v1\x12\x03Pod' | curl -s -o /dev/null -w '%{http_code}' --cacert "$WORK/ca.crt" \
  -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/vnd.kubernetes.protobuf' --data-binary @- "$SERVER/api/v1/namespaces/conf/configmaps")"
check "protobuf body of an undecoded kind is 415" "415" "$CODE"
check "protobuf-preferring Accept gets JSON" "application/json" "$(curl -s -o /dev/null -w '%{content_type}' --cacert "$WORK/ca.crt" \
  -H "Authorization: Bearer $TOKEN" -H 'Accept: application/vnd.kubernetes.protobuf, application/json' "$SERVER/api/v1/namespaces/conf/configmaps")"

echo "== events and leases"
k create -f - >/dev/null <<'EOF'
apiVersion: events.k8s.io/v1
kind: Event
metadata: {name: pool1.evt, namespace: conf}
eventTime: "2025-01-01T00:00:00.000000Z"
reportingController: example.com/ctl
reportingInstance: ctl-1
action: Allocate
reason: Allocated
type: Normal
note: allocated 10.0.0.1
regarding: {kind: LoadBalancer, name: lb1, namespace: conf}
EOF
check "events.k8s.io event read through core/v1" "allocated 10.0.0.1 Allocated" \
  "$(k get events -n conf --field-selector involvedObject.name=lb1 -o jsonpath='{.items[0].message} {.items[0].reason}')"
k create -f - >/dev/null <<'EOF'
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: leader, namespace: conf}
spec: {holderIdentity: replica-a, leaseDurationSeconds: 15}
EOF
check "lease table" "leader replica-a" "$(k get lease leader -n conf --no-headers | awk '{print $1, $2}')"

echo "== namespace deletion"
check "delete namespace" 'namespace "conf" deleted' "$(k delete ns conf --timeout=20s)"
run k get ns conf
check "namespace gone" "1" "$RC"
check "CRD delete removes instances" 'customresourcedefinition.apiextensions.k8s.io "ippools.loadbalancer.harvesterhci.io" deleted' \
  "$(k delete crd ippools.loadbalancer.harvesterhci.io --timeout=20s)"

echo
echo "conformance: $PASSED passed, $FAILED failed"
[[ "$FAILED" -eq 0 ]]
