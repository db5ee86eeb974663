#!/usr/bin/env bash
# The web console's tests (tests/ui/): its pure logic under node's test runner, then the browser
# tests, which start the real binary (built here, so it embeds the current ui/) on fresh embedded
# stores and drive Debian's chromium headless with playwright-core, writing each page's
# screenshot to docs/src/screenshots/ (the manual shows them). The Kubernetes-backend smoke test
# of the console runs with the rest of the suite (tests/console.rs, against a real control plane).
#
# Needs node (20 or later), tests/ui/node_modules (npm ci, pinned by tests/ui/package-lock.json)
# and /usr/bin/chromium: scripts/test-tools.sh installs what is missing. Never downloads a browser.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v node >/dev/null || { echo "node is required (scripts/test-tools.sh installs it)" >&2; exit 1; }
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || {
    echo "chromium is required at ${CHROMIUM:-/usr/bin/chromium} (apt-get install chromium)" >&2
    exit 1
}
[ -d tests/ui/node_modules/playwright-core ] || npm ci --prefix tests/ui --no-audit --no-fund

cargo build --quiet --bin harvester-cloud
HARVESTER_CLOUD_BIN="$(cargo metadata --format-version 1 --no-deps | jq -r .target_directory)/debug/harvester-cloud"
export HARVESTER_CLOUD_BIN

# One file at a time: each starts its own servers and browser.
node --test --test-concurrency=1 tests/ui/model.test.mjs tests/ui/console.test.mjs
