#!/usr/bin/env bash
# Builds one of the Go test tools under tools/ (a module with a main package, e.g. rancher-peer)
# when it is not cached, and prints the binary's path. Cached outside the repository, keyed by a
# hash of the module's files: ${HARVESTER_CLOUD_CACHE:-~/.cache/harvester-cloud}/tools/<name>-<hash>.
#
#   scripts/go-tool.sh rancher-peer
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name="${1:?usage: $0 TOOL}"
mod="$root/tools/$name"
[ -f "$mod/go.mod" ] || { echo "go-tool: no Go module at $mod" >&2; exit 1; }
command -v go >/dev/null || { echo "go-tool: go is not on PATH" >&2; exit 1; }
cache_root="${HARVESTER_CLOUD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/harvester-cloud}"
sum="$(cd "$mod" && find . -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' \) -print0 | sort -z | xargs -0 cat | sha256sum | cut -c1-12)"
out="$cache_root/tools/$name-$sum/$name"
if [ ! -x "$out" ]; then
    echo "go-tool: building $name" >&2
    mkdir -p "$(dirname "$out")"
    tmp="$(mktemp "$(dirname "$out")/.build.XXXXXX")"
    (cd "$mod" && CGO_ENABLED=0 go build -trimpath -o "$tmp" .) || { rm -f "$tmp"; echo "go-tool: go build of $name failed" >&2; exit 1; }
    mv -f "$tmp" "$out"
fi
echo "$out"
