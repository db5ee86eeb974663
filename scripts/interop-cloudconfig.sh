#!/usr/bin/env bash
# Runs the cloud-config differential test (tests/cloud_config_upstream.rs) against Harvester's own
# handler built from a harvester/harvester checkout, e.g. the v1.9 line, which the Go module proxy
# does not serve. scripts/interop.sh calls it; by hand:
#
#   git -C /path/to/harvester.git archive v1.9.0-rc6 | tar -x -C /tmp/harvester-v1.9
#   VERSION=v1.9.0-rc6 scripts/interop-cloudconfig.sh /tmp/harvester-v1.9
#
# VERSION names the checkout's release (an archive has no git history to ask; default v1.9.0): it
# picks the router rules the peer applies in front of the handler (tools/upstream-cloudconfig) and
# the rows of docs/src/api.md the test holds it to (those of its line, v1.9). The peer is built from the
# checkout's vendor/ (offline) when it has one, else through the module proxy, and cached by
# version and go.sum hash (scripts/upstream-cloudconfig.sh build-checkout). The build adds one
# directory to the checkout, cmd/harvester-cloud-upstream-cloudconfig, holding our main.go.
#
# One control plane is started for the run (scripts/control-plane.sh with 1), and the test's report
# (each case: same, or what differs) is printed whether it passes or not.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
checkout="${1:?usage: $0 CHECKOUT_DIR (a harvester/harvester source tree, e.g. from git archive)}"
if [ ! -f "$checkout/go.mod" ] || [ ! -d "$checkout/pkg/api/kubeconfig" ]; then
    echo "interop-cloudconfig: $checkout is not a harvester/harvester source tree" >&2
    exit 1
fi
export VERSION="${VERSION:-v1.9.0}"
echo "interop-cloudconfig: building Harvester's handler from $checkout ($VERSION)" >&2
bin="$("$root/scripts/upstream-cloudconfig.sh" build-checkout "$checkout")"
echo "interop-cloudconfig: peer $bin" >&2
cd "$root"
# nextest where it is installed (scripts/test-tools.sh installs it), else the same test through libtest.
runner=(cargo nextest run --test cloud_config_upstream --no-capture)
if ! cargo nextest --version >/dev/null 2>&1; then
    runner=(cargo test --test cloud_config_upstream -- --nocapture)
fi
HARVESTER_CLOUD_UPSTREAM_CLOUDCONFIG="$bin" scripts/control-plane.sh with 1 "${runner[@]}"
