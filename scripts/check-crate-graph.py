#!/usr/bin/env python3
"""Checks the workspace's crate graph against the architecture (DESIGN's rules as dependencies).

Every crate sits on a floor and may depend only on crates of lower floors: so `lb` and `guest`
(one floor) never depend on each other, the store imports no domain, and nothing depends on the
binary. The pure `ipam` crate has no I/O dependency at all. Reads `cargo metadata`; exits non-zero
with every broken rule listed.
"""
import json
import subprocess
import sys

FLOORS = {
    "harvester-cloud-ipam": 0,
    "harvester-cloud-metrics": 0,
    "harvester-cloud-store": 1,
    "harvester-cloud-api": 2,
    "harvester-cloud-controller": 3,
    "harvester-cloud-cloudconfig": 4,
    "harvester-cloud-lb": 4,
    "harvester-cloud-guest": 4,
    "harvester-cloud": 5,
}
# Crates that must stay free of I/O and frameworks, and what they may not use.
PURE = {"harvester-cloud-ipam": {"tokio", "kube", "k8s-openapi", "sqlx", "axum", "hyper", "tower"}}

meta = json.loads(
    subprocess.check_output(["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"])
)
members = {p["name"]: p for p in meta["packages"]}
errors = []
for name in members:
    if name not in FLOORS:
        errors.append(f"{name}: not placed on a floor in {__file__}")
for name in FLOORS:
    if name not in members:
        errors.append(f"{name}: expected in the workspace, missing")
for name, pkg in members.items():
    floor = FLOORS.get(name)
    for dep in pkg["dependencies"]:
        if dep["kind"] not in (None, "build"):
            continue  # dev-dependencies (tests) may reach anything
        d = dep["name"]
        if d in FLOORS and floor is not None and FLOORS[d] >= floor:
            errors.append(f"{name} (floor {floor}) depends on {d} (floor {FLOORS[d]}): not below it")
        if d in PURE.get(name, ()):
            errors.append(f"{name} must stay pure but depends on {d}")
for e in errors:
    print("crate graph:", e, file=sys.stderr)
if errors:
    sys.exit(1)
print(f"crate graph: {len(members)} crates, every dependency points to a lower floor")
