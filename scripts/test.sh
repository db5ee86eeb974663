#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test of the workspace, and the kubectl
# conformance check of the Kubernetes API fake. Needs kubectl, cloud-init, jq and curl on PATH
# (.ci/run installs what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo nextest run --workspace"
cargo nextest run --workspace --no-fail-fast

step "doctests"
cargo test --workspace --doc

step "kubectl conformance of the Kubernetes API fake"
scripts/kubectl-conformance.sh

printf '\nall checks passed\n'
