#!/usr/bin/env bash
# The manual (docs/, an mdBook): builds it into docs/book/ with `mdbook build docs`, then checks
# that every relative link and #anchor in docs/src and README.md resolves (scripts/docs-links.py,
# which also compares its heading ids with the built pages). The commands in the pages are run by
# tests/docs.rs, with the rest of the tests.
#
# Needs mdbook on PATH: scripts/test-tools.sh installs the pinned version when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v mdbook >/dev/null; then
    echo "mdbook is missing: scripts/test-tools.sh installs the pinned version (. scripts/test-tools.sh)" >&2
    exit 1
fi
mdbook build docs
python3 scripts/docs-links.py
