#!/usr/bin/env bash
# Builds tools/upstream-cloudconfig: Harvester's own cloud-config handler served on loopback, the
# differential peer of tests/cloud_config_upstream.rs. Prints the binary's path on stdout and its
# progress on stderr.
#
#   scripts/upstream-cloudconfig.sh build               against the harvester/harvester version
#                                                       pinned in tools/upstream-cloudconfig/go.mod,
#                                                       from the Go module proxy
#   scripts/upstream-cloudconfig.sh build-checkout DIR  against a harvester/harvester checkout in DIR
#                                                       (its vendor/ when it has one and it is whole,
#                                                       offline; else the module proxy), VERSION
#                                                       naming its version (default: DIR's git
#                                                       describe, else "v1.9.0")
#
# The binary is cached outside the repository, keyed by the harvester version and a hash of the
# module files that decide the build (our main.go, and go.mod/go.sum: ours, or the checkout's):
# ${HARVESTER_CLOUD_CACHE:-~/.cache/harvester-cloud}/upstream-cloudconfig/harvester-<version>-<hash>/.
# A cold build from the module proxy takes minutes on two cores; a cached one takes no time.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mod="$root/tools/upstream-cloudconfig"
cache_root="${HARVESTER_CLOUD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/harvester-cloud}"

die() {
    printf 'upstream-cloudconfig: %s\n' "$*" >&2
    exit 1
}
say() { printf 'upstream-cloudconfig: %s\n' "$*" >&2; }

command -v go >/dev/null || die "go is not on PATH (Go 1.26 with the module proxy is needed)"

# go_build DIR OUT PKG [go build flags...]: builds with a ticker, so a long compile shows it is alive.
go_build() {
    local dir="$1" out="$2" pkg="$3"
    shift 3
    local start=$SECONDS
    (while sleep 30; do say "  still building ($((SECONDS - start)) s)"; done) &
    local ticker=$!
    local rc=0
    # A test peer: built without optimizations or inlining (-N -l) and without symbols, which
    # takes about a third less CPU to compile (rancher-crds: 157 s of CPU against 102 s) and
    # changes nothing the tests can see.
    (cd "$dir" && CGO_ENABLED=0 go build -trimpath -gcflags=all='-N -l' -ldflags='-s -w' "$@" -o "$out" "$pkg") || rc=$?
    kill "$ticker" 2>/dev/null || true
    wait "$ticker" 2>/dev/null || true
    return "$rc"
}

build() {
    local version sum bindir
    version="$(awk '$1 == "require" && $2 == "github.com/harvester/harvester" { print $3 }
                    $1 == "github.com/harvester/harvester" && $2 ~ /^v/ { print $2 }' "$mod/go.mod" | head -1)"
    [ -n "$version" ] || die "cannot read the harvester version from $mod/go.mod"
    sum="$(cat "$mod/go.mod" "$mod/go.sum" "$mod/main.go" | sha256sum | cut -c1-12)"
    bindir="$cache_root/upstream-cloudconfig/harvester-$version-$sum"
    if [ ! -x "$bindir/upstream-cloudconfig" ]; then
        say "building against harvester $version into $bindir"
        local start=$SECONDS
        say "step download: Go modules"
        (cd "$mod" && go mod download) || die "step download: go mod download failed in $mod"
        say "step build ($((SECONDS - start)) s so far)"
        mkdir -p "$bindir.partial"
        go_build "$mod" "$bindir.partial/upstream-cloudconfig" . || die "step build: go build failed in $mod"
        rm -rf "$bindir"
        mv "$bindir.partial" "$bindir"
        say "built in $((SECONDS - start)) s"
    fi
    echo "$bindir/upstream-cloudconfig"
}

build_checkout() {
    local src="${1:?usage: $0 build-checkout DIR}"
    if [ ! -f "$src/go.mod" ] || [ ! -d "$src/pkg/api/kubeconfig" ]; then
        die "$src is not a harvester/harvester checkout"
    fi
    src="$(cd "$src" && pwd)"
    local version="${VERSION:-}"
    if [ -z "$version" ]; then
        version="$(git -C "$src" describe --tags 2>/dev/null || echo v1.9.0)"
    fi
    local sum bindir
    sum="$(cat "$src/go.mod" "$src/go.sum" "$mod/main.go" | sha256sum | cut -c1-12)"
    bindir="$cache_root/upstream-cloudconfig/harvester-$version-checkout-$sum"
    if [ ! -x "$bindir/upstream-cloudconfig" ]; then
        local start=$SECONDS
        # Our main package goes into the checkout (a scratch copy's own tree, never committed
        # anywhere), so it builds as part of harvester's module: with its vendor/ and replaces.
        local cmd="$src/cmd/harvester-cloud-upstream-cloudconfig"
        mkdir -p "$cmd"
        cp "$mod/main.go" "$cmd/main.go"
        local pkg=./cmd/harvester-cloud-upstream-cloudconfig
        local ldflags="-s -w -X main.harvesterVersion=$version"
        local mode=mod
        mkdir -p "$(dirname "$bindir")"
        if [ -d "$src/vendor" ]; then
            # A checkout whose vendor/ lacks files (a fetched mirror may leave out its largest
            # blobs) cannot build offline: then the module proxy serves what its go.sum names.
            if (cd "$src" && GOFLAGS=-mod=vendor GOPROXY=off go list -deps "$pkg" >/dev/null 2>"$bindir.vendor-check"); then
                mode=vendor
            else
                say "vendor/ of $src is incomplete ($(grep -m1 . "$bindir.vendor-check" || true))"
            fi
            rm -f "$bindir.vendor-check"
        fi
        mkdir -p "$bindir.partial"
        if [ "$mode" = vendor ]; then
            say "building against the checkout $src ($version) from its vendor/, offline"
            GOFLAGS=-mod=vendor GOPROXY=off go_build "$src" "$bindir.partial/upstream-cloudconfig" "$pkg" -ldflags "$ldflags" ||
                die "step build: go build failed in $src"
        else
            # go build downloads only the modules of the packages it builds, far fewer than
            # `go mod download` would for harvester's whole graph.
            say "building against the checkout $src ($version) from the Go module proxy"
            GOFLAGS=-mod=mod go_build "$src" "$bindir.partial/upstream-cloudconfig" "$pkg" -ldflags "$ldflags" ||
                die "step build: go build failed in $src"
        fi
        rm -rf "$bindir"
        mv "$bindir.partial" "$bindir"
        say "built in $((SECONDS - start)) s"
    fi
    echo "$bindir/upstream-cloudconfig"
}

case "${1:-}" in
build) build ;;
build-checkout)
    shift
    build_checkout "$@"
    ;;
*) die "usage: $0 build | build-checkout DIR" ;;
esac
