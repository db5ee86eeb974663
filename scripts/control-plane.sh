#!/usr/bin/env bash
# A real Kubernetes control plane on loopback for the tests: etcd, kube-apiserver and
# kube-controller-manager built from the upstream Go modules pinned in tools/control-plane.
#
#   scripts/control-plane.sh build         build the three binaries and the foreign kinds (both
#                                          cached) and print the binaries' dir
#   scripts/control-plane.sh foreign       build the foreign kinds only (cached) and print their dir
#   scripts/control-plane.sh up DIR        build when not cached, then start all three with state
#                                          in DIR; writes DIR/admin.kubeconfig and DIR/env, and
#                                          copies the foreign kinds into DIR/foreign
#   scripts/control-plane.sh down DIR      stop exactly what `up DIR` started
#   scripts/control-plane.sh with N CMD... start N control planes (in parallel, under a temporary
#                                          dir), run CMD with HARVESTER_CLOUD_CONTROL_PLANES set
#                                          to their dirs (colon-separated), then stop them all
#
# The binaries are cached outside the repository, keyed by the pinned versions and a hash of
# go.mod/go.sum: ${HARVESTER_CLOUD_CACHE:-~/.cache/harvester-cloud}/control-plane/<key>/. A cold
# build takes 10-20 minutes on two cores (it prints progress); a cached one takes no time.
#
# The foreign kinds are the definitions of what we read and do not own, from their upstreams:
# tools/foreign-crds writes KubeVirt's VM, VMI and migration CRDs as virt-operator generates them
# and Multus's NetworkAttachmentDefinition CRD, and prints VMIs built from KubeVirt's Go types;
# tools/rancher-crds writes Rancher's GlobalRoleBinding, APIService, Token, ClusterAuthToken and
# ClusterUserAttribute CRDs as the Rancher that Harvester pins installs them (its own module: it
# needs Rancher's Kubernetes pins, which KubeVirt's contradict). Cached the same way under
# .../foreign-kinds/<key>/ (the tools in bin/, their CRDs together in crds/); a cold build takes
# about 4 minutes of CPU for foreign-crds and 1.5 for rancher-crds.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod="$root/tools/control-plane"

die() {
    printf 'control-plane: %s\n' "$*" >&2
    exit 1
}
say() { printf 'control-plane: %s\n' "$*" >&2; }

# The versions come from go.mod itself, so the cache key and the ldflags cannot drift from it.
modversion() {
    awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }
                   $1 == m && $2 == "=>" { print $4; exit }' "$mod/go.mod"
}
kube_version="$(modversion k8s.io/kubernetes)"
etcd_version="$(modversion go.etcd.io/etcd/server/v3)"
[ -n "$kube_version" ] && [ -n "$etcd_version" ] || die "cannot read the pinned versions from $mod/go.mod"

cache_root="${HARVESTER_CLOUD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/harvester-cloud}"
sum="$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-12)"
bindir="$cache_root/control-plane/kube-$kube_version-etcd-$etcd_version-$sum"

# Takes the build lock NAME (fd 7: held until this script exits), so that two runs on one machine
# (a CI run and a developer's, parallel test runs) build once: the second waits, then finds the
# cache filled.
build_lock() {
    mkdir -p "$cache_root"
    exec 7>"$cache_root/.$1.lock"
    if ! flock -n 7; then
        say "another run is building $1 into the cache; waiting for it"
        flock 7
    fi
}

control_plane_built() {
    [ -x "$bindir/kube-apiserver" ] && [ -x "$bindir/kube-controller-manager" ] && [ -x "$bindir/etcd" ]
}

build() {
    control_plane_built && return 0
    build_lock control-plane
    control_plane_built && return 0
    command -v go >/dev/null || die "step build: go is not on PATH (Go 1.26 with the module proxy is needed)"
    mkdir -p "$bindir.partial"
    local minor="${kube_version#v1.}"
    minor="${minor%%.*}"
    local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kube_version"
    ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
    ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$kube_version"
    ldflags+=" -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
    say "building kube-apiserver, kube-controller-manager $kube_version and etcd $etcd_version into $bindir"
    say "(a cold build takes 10-20 minutes on two cores; it is cached by version afterwards)"
    local start=$SECONDS
    (
        cd "$mod"
        say "step download: Go modules"
        go mod download || die "step download: go mod download failed in $mod"
        local pkg out
        for pkg in k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager go.etcd.io/etcd/server/v3; do
            out="$(basename "$pkg")"
            [ "$out" = v3 ] && out=etcd
            say "step build: $out ($((SECONDS - start)) s so far)"
            # A ticker, so a long compile shows it is alive.
            (while sleep 60; do say "  still building $out ($((SECONDS - start)) s)"; done) &
            local ticker=$!
            if ! CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bindir.partial/$out" "$pkg"; then
                kill "$ticker" 2>/dev/null || true
                die "step build: go build $pkg failed"
            fi
            kill "$ticker" 2>/dev/null || true
            wait "$ticker" 2>/dev/null || true
        done
    )
    rm -rf "$bindir"
    mv "$bindir.partial" "$bindir"
    say "built in $((SECONDS - start)) s"
}

fmod="$root/tools/foreign-crds"
fmodversion() {
    awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$fmod/go.mod"
}
kubevirt_version="$(fmodversion kubevirt.io/kubevirt)"
nad_version="$(fmodversion github.com/k8snetworkplumbingwg/network-attachment-definition-client)"
[ -n "$kubevirt_version" ] && [ -n "$nad_version" ] || die "cannot read the pinned versions from $fmod/go.mod"
rmod="$root/tools/rancher-crds"
fsum="$(cat "$fmod/go.mod" "$fmod/go.sum" "$fmod"/*.go "$rmod/go.mod" "$rmod/go.sum" "$rmod"/*.go | sha256sum | cut -c1-12)"
foreigndir="$cache_root/foreign-kinds/kubevirt-$kubevirt_version-nad-$nad_version-$fsum"

foreign_built() {
    [ -x "$foreigndir/bin/foreign-crds" ] && [ -f "$foreigndir/crds/virtualmachineinstances.kubevirt.io.json" ] &&
        [ -x "$foreigndir/bin/rancher-crds" ] && [ -f "$foreigndir/crds/tokens.management.cattle.io.json" ]
}

build_foreign() {
    foreign_built && return 0
    build_lock foreign-kinds
    foreign_built && return 0
    command -v go >/dev/null || die "step foreign: go is not on PATH (Go 1.26 with the module proxy is needed)"
    say "building the foreign kinds (KubeVirt $kubevirt_version, NetworkAttachmentDefinition $nad_version) into $foreigndir"
    say "(a cold build takes about 6 minutes of CPU; it is cached by version afterwards)"
    local start=$SECONDS
    rm -rf "$foreigndir.partial"
    mkdir -p "$foreigndir.partial/bin"
    local m tool
    for m in "$fmod" "$rmod"; do
        tool="$(basename "$m")"
        (
            cd "$m"
            say "step foreign: go mod download ($tool)"
            go mod download || die "step foreign: go mod download failed in $m"
            say "step foreign: go build tools/$tool ($((SECONDS - start)) s so far)"
            (while sleep 60; do say "  still building $tool ($((SECONDS - start)) s)"; done) &
            local ticker=$!
            # Test tools: no optimizations or inlining (-N -l), no symbols; a third less CPU to
            # compile (rancher-crds: 157 s of CPU against 102 s), and they run for milliseconds.
            if ! CGO_ENABLED=0 go build -trimpath -gcflags=all='-N -l' -ldflags='-s -w' -o "$foreigndir.partial/bin/$tool" .; then
                kill "$ticker" 2>/dev/null || true
                die "step foreign: go build failed in $m"
            fi
            kill "$ticker" 2>/dev/null || true
            wait "$ticker" 2>/dev/null || true
        )
    done
    say "step foreign: writing the CRDs"
    "$foreigndir.partial/bin/foreign-crds" crds "$foreigndir.partial/crds" || die "step foreign: foreign-crds crds failed"
    # norman logs each CRD it creates (here, on a fake API server): kept out of the way unless it fails.
    "$foreigndir.partial/bin/rancher-crds" "$foreigndir.partial/crds" 2>"$foreigndir.partial/rancher-crds.log" ||
        { cat "$foreigndir.partial/rancher-crds.log" >&2; die "step foreign: rancher-crds failed"; }
    rm -rf "$foreigndir"
    mv "$foreigndir.partial" "$foreigndir"
    say "foreign kinds built in $((SECONDS - start)) s"
}

# Free loopback ports, as many as asked, chosen by the kernel.
free_ports() {
    python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

kubeconfig() { # kubeconfig FILE SERVER CERT KEY
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: control-plane
  cluster:
    server: $2
    certificate-authority: $dir/pki/ca.crt
users:
- name: user
  user:
    client-certificate: $3
    client-key: $4
contexts:
- name: control-plane
  context:
    cluster: control-plane
    user: user
current-context: control-plane
EOF
    chmod 600 "$1"
}

pki() {
    local p="$dir/pki"
    mkdir -p "$p"
    chmod 700 "$p"
    (
        cd "$p"
        umask 077
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
            -subj "/CN=harvester-cloud-test-ca" -keyout ca.key -out ca.crt 2>/dev/null
        # name CN O SAN-or-empty
        issue() {
            local ext
            ext="$(mktemp)"
            if [ -n "$4" ]; then
                printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$4" >"$ext"
            else
                printf 'extendedKeyUsage=clientAuth\n' >"$ext"
            fi
            local subj="/CN=$2"
            [ -n "$3" ] && subj="/O=$3/CN=$2"
            openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$subj" \
                -keyout "$1.key" -out "$1.csr" 2>/dev/null
            openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
                -extfile "$ext" -out "$1.crt" 2>/dev/null
            rm -f "$1.csr" "$ext"
        }
        issue apiserver kube-apiserver "" "IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"
        issue admin admin system:masters ""
        # system:masters: the controllers run on the manager's own credential
        # (--use-service-account-credentials=false), and the garbage collector and namespace
        # controller delete every kind.
        issue controller-manager system:kube-controller-manager system:masters ""
        # What the API server presents to admission webhooks (a webhook may require it).
        issue webhook-client kube-apiserver-webhook-client "" ""
        openssl ecparam -name prime256v1 -genkey -noout -out sa.key 2>/dev/null
        openssl ec -in sa.key -pubout -out sa.pub 2>/dev/null
        # Plain users with bearer tokens, as an identity provider would give them (the tests'
        # TokenReview callers): token,user,uid,"groups".
        : >users.csv
        local user groups
        for user in alice:team-a bob: carol: dave:team-a,team-b eve:; do
            groups="${user#*:}"
            user="${user%%:*}"
            printf '%s,%s,%s,"%s"\n' "$(openssl rand -hex 24)" "$user" "uid-$user" "$groups" >>users.csv
        done
    ) || die "step pki: openssl failed"
    cat >"$dir/webhook-client.kubeconfig" <<EOF
apiVersion: v1
kind: Config
users:
  - name: "*"
    user:
      client-certificate: $dir/pki/webhook-client.crt
      client-key: $dir/pki/webhook-client.key
EOF
    cat >"$dir/admission.yaml" <<EOF
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ValidatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: $dir/webhook-client.kubeconfig
  - name: MutatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: $dir/webhook-client.kubeconfig
EOF
    # What the tests read back: every request of a client that is not the control plane itself
    # (the service, the ccm, users), at Metadata level: who, what, and the answer's code.
    cat >"$dir/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: None
    users: ["system:kube-controller-manager", "system:apiserver", "admin"]
  - level: Metadata
EOF
}

wait_ready() { # wait_ready NAME URL SECONDS [curl args...]
    local name="$1" url="$2" limit="$3"
    shift 3
    local i
    for ((i = 0; i < limit * 5; i++)); do
        if curl -fsS --max-time 2 "$@" "$url" >/dev/null 2>&1; then
            return 0
        fi
        pid_alive "$name" || die "step start: $name exited; its log: $dir/$name.log"$'\n'"$(tail -n 20 "$dir/$name.log")"
        sleep 0.2
    done
    die "step start: $name not ready at $url after ${limit} s; its log: $dir/$name.log"
}

pid_alive() {
    local pid
    pid="$(cat "$dir/$1.pid" 2>/dev/null)" || return 1
    kill -0 "$pid" 2>/dev/null
}

start() { # start NAME BINARY ARGS...
    local name="$1" bin="$2"
    shift 2
    # setsid: the processes outlive the shell that started them and ignore its terminal's signals.
    setsid "$bin" "$@" >"$dir/$name.log" 2>&1 </dev/null &
    echo $! >"$dir/$name.pid"
}

up() {
    build
    build_foreign
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    if pid_alive etcd || pid_alive kube-apiserver || pid_alive kube-controller-manager; then
        die "step start: a control plane already runs in $dir (scripts/control-plane.sh down $dir)"
    fi
    say "step pki: CA, serving and client certificates, service-account key in $dir/pki"
    pki
    local ports etcd_port peer_port api_port
    read -r etcd_port peer_port api_port <<<"$(free_ports 3)"

    say "step start: etcd on 127.0.0.1:$etcd_port"
    rm -rf "$dir/etcd"
    start etcd "$bindir/etcd" --name default --data-dir "$dir/etcd" \
        --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
        --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
        --initial-cluster "default=http://127.0.0.1:$peer_port" --unsafe-no-fsync --log-level warn \
        --quota-backend-bytes 8589934592
    wait_ready etcd "http://127.0.0.1:$etcd_port/health" 30

    say "step start: kube-apiserver on https://127.0.0.1:$api_port"
    local p="$dir/pki"
    # Dual-stack Service ranges, so that guest Services may be PreferDualStack or RequireDualStack.
    start kube-apiserver "$bindir/kube-apiserver" \
        --etcd-servers "http://127.0.0.1:$etcd_port" \
        --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
        --endpoint-reconciler-type none \
        --tls-cert-file "$p/apiserver.crt" --tls-private-key-file "$p/apiserver.key" \
        --client-ca-file "$p/ca.crt" --token-auth-file "$p/users.csv" \
        --authorization-mode RBAC \
        --admission-control-config-file "$dir/admission.yaml" \
        --audit-policy-file "$dir/audit-policy.yaml" --audit-log-path "$dir/audit.log" \
        --audit-log-format json --audit-log-mode blocking --audit-log-maxsize 0 \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$p/sa.pub" --service-account-signing-key-file "$p/sa.key" \
        --api-audiences https://kubernetes.default.svc.cluster.local \
        --service-cluster-ip-range 10.96.0.0/16,fd00:10:96::/112 \
        --cert-dir "$dir/apiserver-certs" \
        --max-requests-inflight 1600 --max-mutating-requests-inflight 800 \
        --profiling=false --v 1
    wait_ready kube-apiserver "https://127.0.0.1:$api_port/readyz" 120 \
        --cacert "$p/ca.crt" --cert "$p/admin.crt" --key "$p/admin.key"

    local server="https://127.0.0.1:$api_port"
    kubeconfig "$dir/admin.kubeconfig" "$server" "$p/admin.crt" "$p/admin.key"
    kubeconfig "$dir/controller-manager.kubeconfig" "$server" "$p/controller-manager.crt" "$p/controller-manager.key"

    say "step start: kube-controller-manager"
    start kube-controller-manager "$bindir/kube-controller-manager" \
        --kubeconfig "$dir/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
        --controllers serviceaccount-token-controller,serviceaccount-controller,namespace-controller,garbage-collector-controller,root-ca-certificate-publisher-controller \
        --service-account-private-key-file "$p/sa.key" --root-ca-file "$p/ca.crt" \
        --use-service-account-credentials=false \
        --leader-elect=false --bind-address 127.0.0.1 --secure-port 0 \
        --concurrent-serviceaccount-token-syncs 10 --concurrent-gc-syncs 20 \
        --profiling=false --v 1
    # Ready when the token controller has given the default namespace's ServiceAccount... the
    # service-account controller makes `default`, and the root-CA publisher its ConfigMap.
    local i
    for ((i = 0; i < 300; i++)); do
        if kubectl --kubeconfig "$dir/admin.kubeconfig" -n default get configmap kube-root-ca.crt >/dev/null 2>&1 &&
            kubectl --kubeconfig "$dir/admin.kubeconfig" -n default get serviceaccount default >/dev/null 2>&1; then
            break
        fi
        pid_alive kube-controller-manager || die "step start: kube-controller-manager exited; its log: $dir/kube-controller-manager.log"$'\n'"$(tail -n 20 "$dir/kube-controller-manager.log")"
        sleep 0.2
    done
    ((i < 300)) || die "step start: kube-controller-manager made no default ServiceAccount in 60 s; its log: $dir/kube-controller-manager.log"

    # The tests install these CRDs and make VMIs with this tool (tests/support/kube_env.rs).
    rm -rf "$dir/foreign"
    cp -r "$foreigndir" "$dir/foreign"

    cat >"$dir/env" <<EOF
KUBE_CONTROL_PLANE=$dir
KUBECONFIG_ADMIN=$dir/admin.kubeconfig
KUBE_APISERVER=$server
KUBE_VERSION=$kube_version
EOF
    say "ready: $server (kubectl --kubeconfig $dir/admin.kubeconfig)"
}

down() {
    [ -d "$dir" ] || return 0
    dir="$(cd "$dir" && pwd)"
    local name pid i
    # The controller manager first, etcd last, so nothing logs a lost backend on the way down.
    for name in kube-controller-manager kube-apiserver etcd; do
        pid="$(cat "$dir/$name.pid" 2>/dev/null)" || continue
        # Only a process that is still what we started: its command line names this DIR.
        if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$dir"; then
            kill "$pid" 2>/dev/null || true
            for ((i = 0; i < 100; i++)); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -9 "$pid" 2>/dev/null || true
        fi
        rm -f "$dir/$name.pid"
    done
}

with() {
    local n="$1"
    shift
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "usage: $0 with N CMD..."
    build
    build_foreign
    # Globals, not locals: the EXIT trap runs after this function has returned.
    with_base="$(mktemp -d "${TMPDIR:-/tmp}/harvester-cloud-cp.XXXXXX")"
    with_dirs=()
    local pids=() i base="$with_base"
    for ((i = 0; i < n; i++)); do
        with_dirs+=("$base/cp$i")
    done
    # shellcheck disable=SC2317 # called by the trap
    cleanup() {
        local d
        for d in "${with_dirs[@]}"; do
            "$0" down "$d" || true
        done
        rm -rf "$with_base"
    }
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    say "starting $n control plane(s) under $base"
    for ((i = 0; i < n; i++)); do
        "$0" up "${with_dirs[$i]}" 2>"$base/up$i.log" &
        pids+=($!)
    done
    for ((i = 0; i < n; i++)); do
        if ! wait "${pids[$i]}"; then
            cat "$base/up$i.log" >&2
            die "step start: control plane $i did not come up"
        fi
    done
    HARVESTER_CLOUD_CONTROL_PLANES="$(
        IFS=:
        echo "${with_dirs[*]}"
    )"
    export HARVESTER_CLOUD_CONTROL_PLANES
    say "running: $*"
    local rc=0
    "$@" || rc=$?
    return "$rc"
}

case "${1:-}" in
with)
    [ $# -ge 3 ] || die "usage: $0 with N CMD..."
    shift
    with "$@"
    ;;
build)
    build
    build_foreign
    echo "$bindir"
    ;;
foreign)
    build_foreign
    echo "$foreigndir"
    ;;
up)
    [ $# -eq 2 ] || die "usage: $0 up DIR"
    dir="$2"
    up
    ;;
down)
    [ $# -eq 2 ] || die "usage: $0 down DIR"
    dir="$2"
    down
    ;;
*)
    die "usage: $0 build | foreign | up DIR | down DIR | with N CMD..."
    ;;
esac
