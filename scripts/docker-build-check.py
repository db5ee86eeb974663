#!/usr/bin/env python3
"""Runs the Dockerfile's build stage as written, without a Docker engine.

No engine runs on the development or CI machines, and hadolint only reads the Dockerfile, so a build
that cannot work (a COPY of a missing file, a step that assumes what the context lacks) would pass
review. This script executes the build stage's instructions itself, exactly as written, on a clean
copy of the build context (the files `.dockerignore` lets through):

- FROM must name the toolchain this machine has (`rust:<version>-...` against `rustc --version`),
  since the commands run with it;
- WORKDIR, COPY (of context paths), ENV and RUN are supported; anything else in the build stage is
  an error, so nothing is silently skipped;
- a RUN's `--mount=type=cache,target=T` is a cache BuildKit keeps between builds: a target ending in
  `/target` is the repository's own `target/` directory (so CI reuses what it built), any other is
  the caller's own cache (the crate registry is cargo's, wherever CARGO_HOME is);
- the absolute paths of the stage (WORKDIR and the like) live under a temporary root.

Afterwards every `COPY --from=<build stage>` source of the later stages must exist, and the binary
must run (`--version`).

    scripts/docker-build-check.py [Dockerfile]
"""

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(msg):
    print(f"docker-build-check: {msg}", file=sys.stderr)
    sys.exit(1)


def instructions(text):
    """(keyword, arguments) pairs, with line continuations joined and comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, args = current.partition(" ")
        out.append((keyword.upper(), args.strip()))
        current = ""
    if current:
        fail("the Dockerfile ends inside a continued line")
    return out


def stages(instrs):
    result = []
    for kw, args in instrs:
        if kw == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            result.append({"image": parts[0], "name": name, "steps": []})
        elif result:
            result[-1]["steps"].append((kw, args))
    return result


def ignore_patterns():
    path = os.path.join(ROOT, ".dockerignore")
    pats = []
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line and not line.startswith("#"):
                pats.append(line.rstrip("/"))
    return pats


def ignored(rel, pats):
    parts = rel.split("/")
    for pat in pats:
        if pat.startswith("!"):
            continue
        for i in range(1, len(parts) + 1):
            if fnmatch.fnmatch("/".join(parts[:i]), pat):
                return True
    return False


def copy_context(dest):
    pats = ignore_patterns()
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel_dir = os.path.relpath(dirpath, ROOT)
        rel_dir = "" if rel_dir == "." else rel_dir
        dirnames[:] = [d for d in dirnames if not ignored(os.path.join(rel_dir, d), pats)]
        for f in filenames:
            rel = os.path.join(rel_dir, f)
            if ignored(rel, pats):
                continue
            target = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, rel), target, follow_symlinks=False)


def main():
    dockerfile = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "Dockerfile")
    all_stages = stages(instructions(open(dockerfile).read()))
    if not all_stages:
        fail("no FROM in the Dockerfile")
    build = all_stages[0]
    m = re.fullmatch(r"rust:(\d+\.\d+)(?:\.\d+)?-\w+", build["image"])
    if not m:
        fail(f"the build stage's base image {build['image']} is not a rust:<version>-<os> image")
    rustc = subprocess.run(["rustc", "--version"], capture_output=True, text=True, check=True).stdout
    if not rustc.startswith(f"rustc {m.group(1)}."):
        fail(f"the base image has Rust {m.group(1)}, this machine {rustc.strip()}")

    work = tempfile.mkdtemp(prefix="docker-build-check.")
    try:
        build_stage(build, all_stages, work)
    finally:
        # A failed RUN must not leave a copy of the context (and its cache dirs) behind in /tmp.
        shutil.rmtree(work, ignore_errors=True)
    print("docker-build-check: ok")


def build_stage(build, all_stages, work):
    fsroot = os.path.join(work, "root")
    context = os.path.join(work, "context")
    os.makedirs(fsroot)
    copy_context(context)
    print(f"docker-build-check: context copied to {context}")

    def host(path, cwd):
        path = path if path.startswith("/") else os.path.join(cwd, path)
        return os.path.join(fsroot, os.path.normpath(path).lstrip("/"))

    cwd = "/"
    env = dict(os.environ)
    for kw, args in build["steps"]:
        if kw == "WORKDIR":
            cwd = args if args.startswith("/") else os.path.normpath(os.path.join(cwd, args))
            os.makedirs(host(cwd, "/"), exist_ok=True)
        elif kw == "ENV":
            for pair in shlex.split(args):
                k, _, v = pair.partition("=")
                env[k] = v
        elif kw == "COPY":
            words = shlex.split(args)
            if any(w.startswith("--") for w in words):
                fail(f"COPY {args}: flags in the build stage are not supported by this check")
            *srcs, dst = words
            into_dir = dst.endswith("/") or len(srcs) > 1
            for src in srcs:
                origin = os.path.normpath(os.path.join(context, src))
                if not origin.startswith(context) or not os.path.lexists(origin):
                    fail(f"COPY {args}: {src} is not in the build context")
                if os.path.isdir(origin):
                    shutil.copytree(origin, host(dst, cwd), symlinks=True, dirs_exist_ok=True)
                else:
                    target = host(dst, cwd)
                    if into_dir or os.path.isdir(target):
                        target = os.path.join(target, os.path.basename(src))
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    shutil.copy2(origin, target)
        elif kw == "RUN":
            mounts = []
            rest = args
            while (m := re.match(r"--mount=(\S+)\s+", rest)):
                opts = dict(o.split("=", 1) for o in m.group(1).split(","))
                if opts.get("type") != "cache":
                    fail(f"RUN --mount type {opts.get('type')} is not supported by this check")
                mounts.append(opts["target"])
                rest = rest[m.end():]
            if rest.startswith("--"):
                fail(f"RUN {rest.split()[0]} is not supported by this check")
            command = rest.strip()
            for target in mounts:
                if target.endswith("/target"):
                    cache = os.path.join(ROOT, "target")
                elif target == "/usr/local/cargo/registry":
                    continue  # cargo's own registry, wherever CARGO_HOME is
                else:
                    cache = os.path.join(work, "cache", target.strip("/").replace("/", "_"))
                os.makedirs(cache, exist_ok=True)
                link = host(target, cwd)
                os.makedirs(os.path.dirname(link), exist_ok=True)
                if os.path.lexists(link):
                    shutil.rmtree(link) if os.path.isdir(link) and not os.path.islink(link) else os.remove(link)
                os.symlink(cache, link)
            print(f"docker-build-check: RUN {command}", flush=True)
            r = subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=host(cwd, "/"), env=env)
            if r.returncode != 0:
                fail(f"RUN failed with {r.returncode}: {command}")
        else:
            fail(f"{kw} in the build stage is not supported by this check")

    produced = []
    for stage in all_stages[1:]:
        for kw, args in stage["steps"]:
            if kw == "COPY" and f"--from={build['name']}" in args:
                src = [w for w in shlex.split(args) if not w.startswith("--")][0]
                path = host(src, "/")
                if not os.path.exists(path):
                    fail(f"the image copies {src} from the build stage, which did not produce it")
                produced.append(path)
    if not produced:
        fail("no later stage copies anything from the build stage")
    for path in produced:
        if os.access(path, os.X_OK) and os.path.isfile(path):
            r = subprocess.run([path, "--version"], capture_output=True, text=True)
            if r.returncode != 0:
                fail(f"{path} --version failed: {r.stderr}")
            print(f"docker-build-check: built {r.stdout.strip()}")


if __name__ == "__main__":
    main()
