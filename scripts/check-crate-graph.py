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


def check(packages):
    """Every broken rule of the graph `packages` (cargo metadata's `packages`), as messages."""
    members = {p["name"]: p for p in packages}
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
            d = dep["name"]
            if d not in FLOORS or floor is None:
                if d in PURE.get(name, ()) and dep["kind"] in (None, "build"):
                    errors.append(f"{name} must stay pure but depends on {d}")
                continue
            if dep["kind"] in (None, "build") and FLOORS[d] >= floor:
                errors.append(f"{name} (floor {floor}) depends on {d} (floor {FLOORS[d]}): not below it")
            elif dep["kind"] == "dev" and FLOORS[d] == floor and d != name:
                # Tests may reach a crate above (the binary's), never a sibling: lb and guest
                # stay strangers even in their tests.
                errors.append(f"{name}'s tests depend on its sibling {d} (floor {floor})")
    return errors


def self_test():
    """The rules catch what they are for: a graph with each kind of break is refused."""
    ok = [{"name": n, "dependencies": []} for n in FLOORS]
    assert check(ok) == [], check(ok)
    dep = lambda n, kind=None: {"name": n, "kind": kind}
    broken = {p["name"]: p for p in json.loads(json.dumps(ok))}
    broken["harvester-cloud-lb"]["dependencies"].append(dep("harvester-cloud-guest"))
    broken["harvester-cloud-store"]["dependencies"].append(dep("harvester-cloud-cloudconfig"))
    broken["harvester-cloud-ipam"]["dependencies"].append(dep("tokio"))
    broken["harvester-cloud-guest"]["dependencies"].append(dep("harvester-cloud-lb", "dev"))
    got = check(list(broken.values()))
    for needle in ("harvester-cloud-lb (floor 4) depends on harvester-cloud-guest",
                   "harvester-cloud-store (floor 1) depends on harvester-cloud-cloudconfig",
                   "harvester-cloud-ipam must stay pure but depends on tokio",
                   "harvester-cloud-guest's tests depend on its sibling harvester-cloud-lb"):
        assert any(needle in e for e in got), (needle, got)
    assert len(got) == 4, got
    print("crate graph: self-test passed (4 kinds of break refused)")


if __name__ == "__main__":
    self_test()
    meta = json.loads(
        subprocess.check_output(["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"])
    )
    errors = check(meta["packages"])
    for e in errors:
        print("crate graph:", e, file=sys.stderr)
    if errors:
        sys.exit(1)
    print(f"crate graph: {len(meta['packages'])} crates, every dependency points to a lower floor")
