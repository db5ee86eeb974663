#!/usr/bin/env bash
# Interop with Harvester's own load balancer pieces, run as peers of this service on real control
# planes (issue 24, item 4): upstream's load balancer controller (harvester/load-balancer-harvester)
# and upstream's cloud provider (harvester/cloud-provider-harvester). See docs/src/interop.md.
#
#   scripts/interop.sh checkout DIR LB_GIT CCM_GIT
#       Make DIR from two git repositories (clones or bare mirrors) of load-balancer-harvester and
#       cloud-provider-harvester: the pinned commits below, and load-balancer-harvester's v1.8.0
#       tag (what the cloud provider's go.mod requires), as plain trees, each with a
#       .interop-commit file. The same by hand:
#         git -C LB_GIT archive <commit> | tar -x -C DIR/load-balancer-harvester
#         git -C LB_GIT archive v1.8.0   | tar -x -C DIR/load-balancer-harvester-v1.8.0
#         git -C CCM_GIT archive <commit> | tar -x -C DIR/cloud-provider-harvester
#       and `git -C … rev-parse <commit>^{commit} > DIR/<name>/.interop-commit` for each.
#   scripts/interop.sh --upstream DIR [--only CHECK,...] [--keep]
#       Build both (cached by commit), start control planes (scripts/control-plane.sh), build this
#       service, run the checks (a-e, see docs/src/interop.md) and print the table. Exit status 1 if a
#       check failed. --only runs a subset (baseline, ccm-harvester-crds, ccm-our-crds, our-ccm, diff,
#       takeover, switch-back); --keep leaves the control planes and logs for a look afterwards.
#   scripts/interop.sh build DIR
#       Only build upstream's two binaries (cached) and print their paths.
#
# Nothing of upstream's is kept in this repository: DIR is yours, the binaries go to
# ${HARVESTER_CLOUD_CACHE:-~/.cache/harvester-cloud}/interop/<name>-<commit>-<go.sum hash>/.
# Both upstream modules carry a vendor/ tree and build offline from it (go build -mod=vendor);
# without one the cloud provider resolves only with three replace pins (applied to a copy of its
# go.mod, never to DIR): github.com/google/gnostic-models v0.6.9, github.com/harvester/
# harvester-load-balancer => DIR/load-balancer-harvester-v1.8.0, kubevirt.io/kubevirt v1.7.0.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The pinned upstream commits (2026-12-01): load-balancer-harvester master, cloud-provider-harvester
# master. Change them here, and re-run the checks (docs/src/interop.md keeps the table).
LB_COMMIT=e861dc948324084793b8af7dee22451d8a0d619c
CCM_COMMIT=38cd463fdcfdaf22245669cf3126c19a430ecd47
LB_CCM_TAG=v1.8.0

die() {
    printf 'interop: %s\n' "$*" >&2
    exit 1
}
say() { printf 'interop: %s\n' "$*" >&2; }

cache_root="${HARVESTER_CLOUD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/harvester-cloud}"

checkout() { # checkout DIR LB_GIT CCM_GIT
    local dir="$1" lb_git="$2" ccm_git="$3"
    mkdir -p "$dir"
    local name git rev
    for spec in "load-balancer-harvester:$lb_git:$LB_COMMIT" \
        "load-balancer-harvester-$LB_CCM_TAG:$lb_git:$LB_CCM_TAG" \
        "cloud-provider-harvester:$ccm_git:$CCM_COMMIT"; do
        IFS=: read -r name git rev <<<"$spec"
        local commit
        commit="$(git -C "$git" rev-parse --verify "$rev^{commit}")" || die "step checkout: $rev is not in $git"
        if [ -f "$dir/$name/.interop-commit" ] && [ "$(cat "$dir/$name/.interop-commit")" = "$commit" ]; then
            say "step checkout: $dir/$name is already $commit"
            continue
        fi
        say "step checkout: $name at $commit ($rev) into $dir/$name"
        rm -rf "${dir:?}/$name"
        mkdir -p "$dir/$name"
        git -C "$git" archive "$commit" | tar -x -C "$dir/$name"
        echo "$commit" >"$dir/$name/.interop-commit"
    done
}

commit_of() { # commit_of DIR/NAME
    [ -f "$1/.interop-commit" ] || die "no $1/.interop-commit: make DIR with \`$0 checkout DIR LB_GIT CCM_GIT\`"
    cat "$1/.interop-commit"
}

# go_build NAME SRC PKG OUT: build PKG of the module at SRC into OUT, cached by the module's commit
# and a hash of go.mod/go.sum; prints nothing, fails loudly.
go_build() {
    local name="$1" src="$2" pkg="$3" exe="$4"
    local commit sum out
    commit="$(commit_of "$src")"
    sum="$(cat "$src/go.mod" "$src/go.sum" | sha256sum | cut -c1-12)"
    out="$cache_root/interop/$name-${commit:0:12}-$sum"
    if [ -x "$out/$exe" ]; then
        say "step build: $name ${commit:0:8} cached at $out/$exe"
        echo "$out/$exe"
        return 0
    fi
    command -v go >/dev/null || die "step build: go is not on PATH"
    mkdir -p "$out.partial"
    local flags=(-trimpath -ldflags "-s -w")
    local modfile=()
    if [ -f "$src/vendor/modules.txt" ]; then
        flags+=(-mod=vendor)
        say "step build: $name ${commit:0:8} from its vendor/ (offline)"
    elif [ "$name" = cloud-provider-harvester ]; then
        # A copy of go.mod with the three pins; DIR stays as it was archived.
        local alt="$out.partial/go.mod"
        cp "$src/go.mod" "$alt"
        cp "$src/go.sum" "$out.partial/go.sum"
        local lb11="${src%/*}/load-balancer-harvester-$LB_CCM_TAG"
        [ -f "$lb11/go.mod" ] || die "step build: $lb11 is missing (scripts/interop.sh checkout makes it)"
        go mod edit -modfile="$alt" \
            -replace "github.com/google/gnostic-models=github.com/google/gnostic-models@v0.6.9" \
            -replace "github.com/harvester/harvester-load-balancer=$lb11" \
            -replace "kubevirt.io/kubevirt=kubevirt.io/kubevirt@v1.7.0"
        # -mod=mod: go may complete the copy's go.sum for the pinned versions.
        modfile=(-mod=mod -modfile="$alt")
        say "step build: $name ${commit:0:8} with the module proxy and three replace pins"
    else
        say "step build: $name ${commit:0:8} with the module proxy"
    fi
    local start=$SECONDS
    (while sleep 60; do say "  still building $name ($((SECONDS - start)) s)"; done) &
    local ticker=$!
    if ! (cd "$src" && CGO_ENABLED=0 go build "${flags[@]}" "${modfile[@]}" -o "$out.partial/$exe" "$pkg"); then
        kill "$ticker" 2>/dev/null || true
        die "step build: go build $pkg in $src failed"
    fi
    kill "$ticker" 2>/dev/null || true
    wait "$ticker" 2>/dev/null || true
    rm -rf "$out"
    mv "$out.partial" "$out"
    say "step build: $name built in $((SECONDS - start)) s: $out/$exe"
    echo "$out/$exe"
}

build_upstream() { # build_upstream DIR -> sets lb_bin ccm_bin
    local dir="$1"
    if [ ! -d "$dir/load-balancer-harvester" ] || [ ! -d "$dir/cloud-provider-harvester" ]; then
        die "$dir must hold load-balancer-harvester/ and cloud-provider-harvester/ (see \`$0 checkout\`)"
    fi
    lb_bin="$(go_build load-balancer-harvester "$dir/load-balancer-harvester" . harvester-load-balancer)"
    ccm_bin="$(go_build cloud-provider-harvester "$dir/cloud-provider-harvester" . harvester-cloud-provider)"
}

# Another process may be building the control plane into the shared cache right now: wait for it
# rather than start a second build of the same thing.
control_plane_build() {
    local waited=0
    while ls -d "$cache_root"/control-plane/*.partial >/dev/null 2>&1 &&
        pgrep -f 'control-plane.sh (build|up|with)' >/dev/null; do
        ((waited % 60 == 0)) && say "step control plane: another process is building it into $cache_root/control-plane; waiting ($waited s)"
        sleep 10
        waited=$((waited + 10))
    done
    "$root/scripts/control-plane.sh" build >/dev/null
}

run_checks() { # run_checks DIR [harness args...]
    local dir="$1"
    shift
    local start=$SECONDS
    build_upstream "$dir"
    say "step control plane: etcd, kube-apiserver, kube-controller-manager (scripts/control-plane.sh build)"
    control_plane_build
    say "step build: harvester-cloud (cargo build --bin harvester-cloud)"
    (cd "$root" && cargo build --quiet --bin harvester-cloud) || die "step build: cargo build failed"
    local ours="${CARGO_TARGET_DIR:-$root/target}/debug/harvester-cloud"
    [ -x "$ours" ] || die "step build: no $ours"
    local our_commit
    our_commit="$(git -C "$root" rev-parse HEAD)"
    [ -z "$(git -C "$root" status --porcelain)" ] || our_commit="$our_commit-dirty"
    local work
    work="$(mktemp -d "${TMPDIR:-/tmp}/harvester-cloud-interop.XXXXXX")"
    say "step checks: logs and control planes under $work (builds took $((SECONDS - start)) s)"
    local rc=0
    python3 "$root/scripts/interop/harness.py" --root "$root" --lb-bin "$lb_bin" --ccm-bin "$ccm_bin" \
        --ours "$ours" --harvester-crds "$dir/load-balancer-harvester/crds" --work "$work" \
        --lb-commit "$(commit_of "$dir/load-balancer-harvester")" \
        --ccm-commit "$(commit_of "$dir/cloud-provider-harvester")" --our-commit "$our_commit" \
        --table "$work/table.md" "$@" || rc=$?
    say "the table: $work/table.md; the differential's report: $work/diff-report.json; logs: $work/*.log"
    say "total $((SECONDS - start)) s"
    return "$rc"
}

case "${1:-}" in
--upstream)
    [ $# -ge 2 ] || die "usage: $0 --upstream DIR [--only CHECKS] [--seqs NAMES] [--diff-crds harvester|ours] [--keep]"
    dir="$(cd "$2" && pwd)"
    shift 2
    run_checks "$dir" "$@"
    ;;
checkout)
    [ $# -eq 4 ] || die "usage: $0 checkout DIR LB_GIT CCM_GIT"
    checkout "$2" "$3" "$4"
    ;;
build)
    [ $# -eq 2 ] || die "usage: $0 build DIR"
    build_upstream "$2"
    printf '%s\n%s\n' "$lb_bin" "$ccm_bin"
    ;;
*)
    die "usage: $0 checkout DIR LB_GIT CCM_GIT | build DIR | --upstream DIR [--only CHECKS] [--keep]"
    ;;
esac
